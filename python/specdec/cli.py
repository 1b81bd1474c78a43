"""The ``specdec`` console script."""

from __future__ import annotations

import argparse
import platform
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="time the Rust builder beside the plain-Python version")
    b.add_argument("--quick", action="store_true", help="shorter timing loops")
    args = parser.parse_args(argv)
    if args.command == "bench":
        import numpy as np

        from . import __version__
        from .benchmarks import bench_tree

        print(
            f"specdec {__version__}, python {platform.python_version()}, numpy {np.__version__}, "
            f"{platform.machine()}"
        )
        print("DDTree build, L=16 depths, prefix_len=512 (median per call):\n")
        print(bench_tree(quick=args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
