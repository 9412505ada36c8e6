"""A real HTTP server for an ASGI app, and the flags this machine's Chromium needs; shared by the
browser tests and bench/explorer.py."""
from __future__ import annotations

import socket
import threading
import time

# No sandbox as root, and no background traffic to Google's hosts (refused here, noise anywhere).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


class LiveServer:
    """uvicorn serving the app on a free port of 127.0.0.1, in a thread of this process."""

    def __init__(self, app) -> None:
        import uvicorn  # the serve extra: imported only where a live server is wanted

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
