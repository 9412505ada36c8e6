"""The mock LLM server (tests/mock_llm.py) in its own process, for benchmarks: the measured
process's CPU time is then sensegraph's alone, and the server's own CPU is read from /proc."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

MOCK = Path(__file__).resolve().parents[1] / "tests" / "mock_llm.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"mock server did not open port {port}")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a running process, from /proc (0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass
class MockProcess:
    base_url: str
    pid: int

    def cpu(self) -> float:
        return proc_cpu(self.pid)


@contextmanager
def mock_server_process(latency: float = 0.0, *args: str, answer_scale: float = 1.0) -> Iterator[MockProcess]:
    """`args`: more options of tests/mock_llm.py, e.g. "--yes-rate", "0.3"; `answer_scale`: answers
    that many times longer (a model more verbose than the mock)."""
    port = free_port()
    scale = ["--answer-scale", str(answer_scale)] if answer_scale != 1.0 else []
    server = subprocess.Popen([sys.executable, str(MOCK), "--port", str(port), "--latency", str(latency), *scale,
                               *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield MockProcess(f"http://127.0.0.1:{port}/v1", server.pid)
    finally:
        server.terminate()
        server.wait()
