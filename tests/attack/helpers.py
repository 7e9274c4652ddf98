"""Servers for the attack suite: in-process (optionally with small socket buffers) or as a process."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx

from leyline_server.local import free_port, local_service, serve_in_thread

MODEL = "tiny-gqa"  # the same weights on the embedded and the llama.cpp engine
KEYS = ("key-a", "key-b")


def service(engine: str, kv_budget_mb: float = 8.0, **config: Any) -> Any:
    """A service for ``MODEL`` on ``engine`` (context 4,096 tokens; ``config`` overrides ServerConfig)."""
    return local_service(MODEL, engine=engine, kv_budget_mb=kv_budget_mb, **config)


def auth(key: str) -> dict[str, str]:
    """The Authorization header of ``key``."""
    return {"Authorization": f"Bearer {key}"}


@contextlib.contextmanager
def serve(svc: Any, send_buffer: int | None = None) -> Iterator[str]:
    """Serve ``svc`` on a loopback port until the block ends; yields the base URL.

    ``send_buffer`` fixes the server sockets' send buffer (bytes): a client that stops reading
    then blocks the server's writes after ~100 KB instead of the ~4 MB Linux grows it to on
    loopback, as on a slow link.
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)  # inherited by accepted sockets
    sock.bind(("127.0.0.1", 0))
    with serve_in_thread(svc, sock=sock) as url:
        yield url


class ServerProcess:
    """``leyline-server`` as its own process (SIGKILL and RSS need one)."""

    def __init__(self, engine: str, port: int | None = None, *flags: str) -> None:
        self.engine, self.port, self.flags = engine, port or free_port(), flags
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> ServerProcess:
        """Start it and wait for ``/health``."""
        cmd = [sys.executable, "-m", "leyline_server.cli", "--model-path", MODEL, "--engine", self.engine]
        cmd += ["--port", str(self.port), "--kv-budget-mb", "8", "--context-length", "4096", "--log-level", "warning"]
        cmd += list(self.flags)
        self.proc = subprocess.Popen(cmd, env=os.environ.copy())
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("the server did not answer /health")

    def rss(self) -> int:
        """Resident memory of the server process, bytes."""
        import psutil

        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raw_request(url: str, head: bytes, body_chunks: list[bytes], wait_s: float = 10.0) -> tuple[bytes, int]:
    """Send ``head`` and then ``body_chunks`` over a raw socket, stopping as soon as the server
    answers; returns (the answer's first bytes, body bytes sent before the answer came)."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(head)
        for chunk in body_chunks:
            if select.select([s], [], [], 0.01)[0]:
                break  # the server answered (or closed)
            try:
                s.sendall(chunk)
            except OSError:
                break
            sent += len(chunk)
        try:
            return s.recv(65536), sent
        except OSError:
            return b"", sent
