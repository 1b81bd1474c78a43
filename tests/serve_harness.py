"""`specdec serve` as a subprocess on a free 127.0.0.1 port, for tests/test_serve.py and
tests/soak_serve.py: start it, wait for /health, read /metrics and the process's threads,
memory and CPU, stop it with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

__all__ = ["Server", "free_port", "poll", "start_server"]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, by its name with labels."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def threads(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/task"))

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS line")

    def cpu_s(self) -> float:
        """User and system CPU seconds the process has used."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then its exit status (killed if it has not exited by ``timeout``)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(args: Sequence[str], log_dir: Path, timeout: float = 300) -> Server:
    """``python -m specdec serve --port <free> *args``, once /health answers 200; a
    RuntimeError with the log's tail when it exits or does not start in time."""
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "specdec", "serve", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited {proc.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise RuntimeError(f"the server did not start in {timeout:.0f} s:\n{server.log_tail()}")


def poll(cond: Callable[[], bool], seconds: float, every: float = 0.1) -> bool:
    """Whether ``cond()`` holds within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()
