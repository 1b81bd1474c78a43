"""The architecture docs match the folders: every file and folder docs/architecture.md names
exists, every module of the package is named there and imports, and its stage table names
every stage's folder in both languages."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import specdec

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def block_after(text: str, heading: str) -> str:
    """The first fenced block after ``heading``."""
    rest = text[text.index(heading) :]
    return rest.split("```", 2)[1]


def named(block: str, ext: str) -> tuple[set[str], set[str]]:
    """File names with ``ext`` and folder names (``name/``) mentioned in ``block``."""
    files = set(re.findall(rf"\b([a-z_][a-z0-9_]*{re.escape(ext)})\b", block))
    folders = set(re.findall(r"\b([a-z_][a-z0-9_]*)/", block))
    return files, folders


def on_disk(root: Path, ext: str) -> tuple[set[str], set[str]]:
    paths = [p for p in root.rglob(f"*{ext}") if not any(x.startswith(".") for x in p.parts)]
    files = {p.name for p in paths if p.name != "__init__.py"}
    folders = {p.parent.name for p in paths if p.parent != root}
    return files, folders


def test_python_tree_in_docs_matches_the_package() -> None:
    files, folders = named(block_after(DOC, "## Python package"), ".py")
    files.discard("__init__.py")
    disk_files, disk_folders = on_disk(ROOT / "python" / "specdec", ".py")
    disk_files |= {"_core.pyi"} if (ROOT / "python/specdec/_core.pyi").exists() else set()
    files |= set(re.findall(r"\b(_core\.pyi)\b", DOC))
    assert files == disk_files, f"doc only: {files - disk_files}; disk only: {disk_files - files}"
    assert disk_folders <= folders, f"folders not in the doc: {disk_folders - folders}"


def test_rust_tree_in_docs_matches_the_crates() -> None:
    files, folders = named(block_after(DOC, "## Rust"), ".rs")
    disk_files, disk_folders = set(), set()
    for crate_src in (ROOT / "rust/core/src", ROOT / "rust/python/src"):
        f, d = on_disk(crate_src, ".rs")
        disk_files |= f
        disk_folders |= d
    assert files == disk_files, f"doc only: {files - disk_files}; disk only: {disk_files - files}"
    assert disk_folders <= folders, f"folders not in the doc: {disk_folders - folders}"


def test_every_module_imports() -> None:
    names = [
        m.name
        for m in pkgutil.walk_packages(specdec.__path__, "specdec.")
        if m.name != "specdec._core"
    ]
    assert len(names) > 30
    for name in names:
        importlib.import_module(name)


def test_stage_table_names_every_stage_folder() -> None:
    table = DOC[DOC.index("| stage | Python") :].split("\n\n")[0]
    rows = [r for r in table.splitlines()[2:] if r.startswith("|")]
    python = {f for r in rows for f in re.findall(r"`([a-z_]+)/`", r.split("|")[2])}
    rust = {f for r in rows for f in re.findall(r"`([a-z_]+)/", r.split("|")[3])}
    for stage in ("draft", "tree", "constrain", "verify", "cache", "decode", "models"):
        assert stage in python, stage
        assert (ROOT / "python" / "specdec" / stage).is_dir(), stage
    for folder in rust:
        assert (ROOT / "rust" / "core" / "src" / folder).is_dir(), folder
    assert {"draft", "tree", "constrain", "kv", "decode", "linear", "model"} <= rust, rust
