"""An ASGI app served by uvicorn on a loopback port in a background thread, for tests of HTTP
clients against a real server (OpenAI-compatible stand-ins for teachers and annotators)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


@contextlib.contextmanager
def serve(app: Any, **config: Any) -> Iterator[int]:
    """Serve ``app`` on 127.0.0.1 (the socket is bound up front: no free-port window); yields the
    port and stops the server on exit. ``config``: extra ``uvicorn.Config`` options."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **config))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not srv.started:
        assert time.time() < deadline, "test server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(timeout=5)
        sock.close()
