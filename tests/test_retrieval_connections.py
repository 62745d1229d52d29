"""The retrieval server's connection bounds: held idle connections (a real server on loopback)
never keep a good client from its answers."""

import json
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from common.retrieval import Doc, HTTPRetriever
from common.retrieval.server import ServerLimits, create_app, server_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parent.parent


def _corpus(folder: Path) -> Path:
    path = folder / "corpus.jsonl"
    rows = [{"id": str(i), "contents": f'"Title {i}"\nword{i} shared text'} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _hold(port: int, n: int) -> list[socket.socket]:
    """``n`` connections to the server that send nothing."""
    held = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        held.append(s)
    return held


def _closed_by_server(socks: list[socket.socket], wait: float) -> list[bool]:
    """Whether each socket saw the server close it (EOF or a reset) within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    out = []
    for s in socks:
        s.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            out.append(s.recv(1) == b"")
        except (ConnectionResetError, BrokenPipeError):
            out.append(True)
        except TimeoutError:
            out.append(False)
    return out


@pytest.fixture
def low_fd_server(tmp_path, free_port) -> Iterator[tuple[str, int, subprocess.Popen]]:
    """``python -m common.retrieval serve`` with its defaults, under ``ulimit -n 256``."""
    port = free_port()
    cmd = [sys.executable, "-m", "common.retrieval", "serve", "--corpus", str(_corpus(tmp_path))]
    cmd += ["--port", str(port), "--bm25-backend", "numpy"]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            assert time.monotonic() < deadline, "server not up after 60 s"
        yield url, port, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_300_idle_connections_under_ulimit_256_leave_a_good_client_its_answers(low_fd_server):
    """The fault-injection probe at a quarter of its size: more idle loopback connections than the
    server's open-file limit. Before, the server ran out of descriptors and a good client got
    no answer at all (1,100 connections under ulimit 1024: 0 of 98 requests in 20 s)."""
    url, port, proc = low_fd_server
    held = _hold(port, 300)
    try:
        start = time.monotonic()
        answered = 0
        with HTTPRetriever(url, timeout=2.0, retries=0) as client:
            for i in range(20):
                docs = client.search([f"word{i % 8}"], 1)
                assert docs[0][0].id == str(i % 8)
                answered += 1
        assert answered == 20
        assert time.monotonic() - start < 10
        # the server closed held connections to stay under its descriptor limit
        assert sum(_closed_by_server(held, wait=1.0)) >= 300 - 256
    finally:
        for s in held:
            s.close()
    proc.terminate()
    _, err = proc.communicate(timeout=10)
    # 512 connections cannot fit under 256 descriptors: the server said so when it started
    assert re.search(
        r"max_connections 512 lowered to \d+: the open-file limit \(ulimit -n\) is 256", err
    )


class Echo:
    """A backend that answers each query with one doc holding it."""

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        return [[Doc("7", "T", q, 1.5)] for q in queries]


@pytest.fixture
def bounded_server() -> Iterator[Callable[[ServerLimits], tuple[str, int]]]:
    """An in-process server on loopback, on ``server_config`` (what ``serve`` runs)."""
    servers = []

    def start(limits: ServerLimits) -> tuple[str, int]:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        srv = uvicorn.Server(
            server_config(create_app(Echo(), 1, limits), limits, log_level="error")
        )
        thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        servers.append((srv, thread, sock))
        port = sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break  # listening
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        return url, port

    yield start
    for srv, thread, sock in servers:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_past_the_cap_the_oldest_idle_connections_are_closed_and_a_client_is_answered(
    bounded_server,
):
    """Cap 8, 12 idle connections held: the 4 oldest are closed as the 9th to 12th arrive, the
    8 newest stay; a client then gets its answers, its connection closing one more (the 5th)."""
    url, port = bounded_server(ServerLimits(max_connections=8, idle_timeout_s=60))
    held = _hold(port, 12)
    try:
        assert _closed_by_server(held[:4], wait=5.0) == [True] * 4
        assert _closed_by_server(held[4:], wait=0.3) == [False] * 8
        with HTTPRetriever(url, timeout=2.0, retries=0) as client:
            for i in range(5):
                assert client.search([f"q{i}"], 1) == [[Doc("7", "T", f"q{i}", 1.5)]]
        assert _closed_by_server(held[4:5], wait=5.0) == [True]
        assert _closed_by_server(held[5:], wait=0.3) == [False] * 7
    finally:
        for s in held:
            s.close()


def test_an_idle_connection_is_closed_after_the_idle_timeout_however_it_trickles(bounded_server):
    """idle_timeout_s 0.5: a silent connection, one that trickles a request's headers a byte
    every 0.1 s (uvicorn's keep-alive timer restarts on every byte: it was never closed) and a
    keep-alive connection after its answer are each closed 0.5 s after they opened or were
    answered; the body of a request must arrive within body_timeout_s (0.5 s), else a 408."""
    url, port = bounded_server(ServerLimits(idle_timeout_s=0.5, body_timeout_s=0.5))
    silent, trickler = _hold(port, 2)
    opened = time.monotonic()
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Slow: "
    trickler.sendall(head[:20])
    closed_at = None
    for byte in head[20:] + b"a" * 30:  # 4 s of trickling, if it were let
        try:
            trickler.sendall(bytes([byte]))
        except OSError:
            closed_at = time.monotonic()
            break
        trickler.settimeout(0.1)
        try:
            if trickler.recv(1) == b"":
                closed_at = time.monotonic()
                break
        except TimeoutError:
            pass
    assert closed_at is not None and 0.4 < closed_at - opened < 1.5
    assert _closed_by_server([silent], wait=0.5) == [True]

    with socket.create_connection(("127.0.0.1", port), timeout=5) as kept:  # keep-alive
        body = b'{"queries": ["a"], "topk": 1}'
        kept.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        reply = kept.recv(4096)
        answered = time.monotonic()
        assert reply.startswith(b"HTTP/1.1 200") and b"connection: close" not in reply.lower()
        assert kept.recv(4096) == b""  # then closed by the server, once idle for 0.5 s
        assert 0.4 < time.monotonic() - answered < 1.5

    with socket.create_connection(("127.0.0.1", port), timeout=5) as slow_body:
        slow_body.sendall(
            b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"queries": ["a'
        )
        start = time.monotonic()
        reply = slow_body.recv(4096).decode()
        assert 0.4 < time.monotonic() - start < 1.5
    assert reply.startswith("HTTP/1.1 408")
    detail = json.loads(reply.split("\r\n\r\n", 1)[1])["detail"]
    assert detail == "body: not received whole within 0.5 s (body_timeout_s); got 15 bytes"


def test_connection_limits_must_be_positive():
    with pytest.raises(ValueError, match="^max_connections: must be at least 1, got 0$"):
        ServerLimits(max_connections=0)
    with pytest.raises(ValueError, match="^idle_timeout_s: must be over 0 seconds, got 0$"):
        ServerLimits(idle_timeout_s=0)
