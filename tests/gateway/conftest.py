"""Helpers for the gateway's tests: real uvicorn servers on 127.0.0.1 (the tiny model's fixture,
`tiny_path`, is in tests/conftest.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

# Only for the folders that still import `tiny_path` from here (tests/engine, tests/controller,
# tests/examples); pytest finds it in tests/conftest.py. Delete once they no longer do.
from tests.conftest import tiny_path  # noqa: F401


@contextmanager
def serve_server(app: object, port: int = 0) -> Iterator[tuple[str, uvicorn.Server]]:
    """Run an ASGI app with uvicorn in a thread on `port` (default: a free one); yield its base URL
    and the server (setting its `should_exit` stops it early)."""
    sock = socket.socket()
    # a port a server just left can be served again
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(
        uvicorn.Config(app, ws="none", log_level="warning", timeout_graceful_shutdown=2)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", server
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def serve(app: object, port: int = 0) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a thread on `port` (default: a free one); yield its base URL."""
    with serve_server(app, port) as (url, _):
        yield url
