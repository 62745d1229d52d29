"""HTTP retrieval server speaking Search-R1's protocol, so either side can be swapped.

`POST /retrieve` takes `{"queries": [...], "topk": k, "return_scores": bool}` (`topk`
optional, the server's default; `return_scores` false by default) and answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` with scores or
`{"result": [[{"id", "contents"}, ...], ...]}` without. `GET /health` answers
`{"status": "ok", "num_docs": N}`. A bad request gets a 4xx with a JSON `detail` naming the
field (an unknown field is one: `"topK"` is not `"topk"`); a body over `max_body_bytes` gets a
413 before it is read whole, one that is not UTF-8 a 400; the server keeps serving.

Connections are bounded (`ServerLimits`, `serve`): at most `max_connections` at once (lowered to
what the open-file limit holds), the oldest idle one closed to make room for a new one; a
connection with no request in progress is closed `idle_timeout_s` after it opened or got its
last answer, however slowly it trickles a request's headers; a body must arrive whole within
`body_timeout_s` of its headers (else a 408). Idle connections, however many, never keep a
client that sends its request from its answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.retrieval.base import Retriever, doc_contents

if TYPE_CHECKING:  # uvicorn is imported when a server starts
    from uvicorn import Config

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerLimits:
    """Per-request bounds; requests beyond them get a 422 (a body over max_body_bytes: 413, one
    not received whole within body_timeout_s: 408). And the connection bounds of `serve`:
    max_connections open at once, idle_timeout_s for a connection without a request."""

    default_topk: int = 3
    max_queries: int = 512
    max_query_chars: int = 2048
    max_topk: int = 100
    # 512 queries of 2048 characters, each escaped as JSON's \uXXXX (6 bytes): 6 MiB and the
    # envelope. The defaults fit together: any request within the other limits is accepted.
    max_body_bytes: int = 8 * 2**20
    # Half the usual `ulimit -n` of 1024 (lowered at start when the limit holds fewer); a
    # training run keeps one connection a rank, an evaluation a few.
    max_connections: int = 512
    # uvicorn's keep-alive default; here it also bounds the time to send a request's headers
    idle_timeout_s: float = 5.0
    # 8 MiB (max_body_bytes) at 2.2 Mbit/s
    body_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        counts = ("default_topk", "max_queries", "max_query_chars", "max_topk")
        for name in (*counts, "max_body_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be at least 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be over 0 seconds, got {getattr(self, name)}")


class RetrieveRequest(BaseModel):
    """Search-R1's request body; strict, so `"3"` is not a topk and `1` is not a query."""

    model_config = ConfigDict(strict=True, extra="forbid")

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def _check(req: RetrieveRequest, limits: ServerLimits) -> int:
    """The request's topk after checking it and the queries against the limits."""
    if len(req.queries) > limits.max_queries:
        raise HTTPException(
            422, f"queries: at most {limits.max_queries} a request, got {len(req.queries)}"
        )
    for i, query in enumerate(req.queries):
        if len(query) > limits.max_query_chars:
            raise HTTPException(
                422, f"queries.{i}: at most {limits.max_query_chars} characters, got {len(query)}"
            )
    topk = limits.default_topk if req.topk is None else req.topk
    if not 1 <= topk <= limits.max_topk:
        raise HTTPException(422, f"topk: must be between 1 and {limits.max_topk}, got {topk}")
    return topk


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's default answer lists every pydantic error in full; one short line that
    # names the first bad field is what a client's log needs.
    unknown = [str(e["loc"][-1]) for e in exc.errors() if e["type"] == "extra_forbidden"]
    if unknown:
        allowed = ", ".join(RetrieveRequest.model_fields)
        detail = f"unknown field{'s' * (len(unknown) > 1)} {', '.join(unknown)}; allowed: {allowed}"
        return JSONResponse({"detail": detail}, status_code=422)
    err = exc.errors()[0]
    if err["type"] == "json_invalid":
        reason = err.get("ctx", {}).get("error", "")
        return JSONResponse({"detail": f"body: invalid JSON ({reason})"}, status_code=400)
    field = ".".join(str(part) for part in err["loc"] if part != "body")
    if not field:  # the body as a whole: not an object, or not sent as JSON
        hint = "send a JSON object with Content-Type: application/json"
        return JSONResponse({"detail": f"body: {err['msg']}; {hint}"}, status_code=422)
    return JSONResponse({"detail": f"{field}: {err['msg']}"}, status_code=422)


def _failure(exc: Exception) -> JSONResponse:
    log.exception("retrieval failed")
    return JSONResponse(
        {"detail": f"retrieval failed: {type(exc).__name__}: {exc}"}, status_code=500
    )


async def _failed(request: Request, exc: Exception) -> JSONResponse:
    return _failure(exc)


class BodyLimit:
    """ASGI middleware: read the request body (at most `max_bytes` of it, within `timeout_s`
    seconds) before the app sees it; a larger one gets a 413 without being read further (a
    declared Content-Length over the limit: without reading any), one that does not arrive in
    time a 408, a body that is not UTF-8 a 400 naming the first bad byte."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, 413, self._too_large(int(declared)))
            return
        chunks: list[bytes] = []
        try:
            rejected = await asyncio.wait_for(self._read(receive, chunks), self.timeout_s)
        except TimeoutError:
            got = sum(map(len, chunks))
            detail = (
                f"body: not received whole within {self.timeout_s:g} s (body_timeout_s); "
                f"got {got} bytes"
            )
            await self._reject(send, 408, detail)
            return
        if rejected is not None:  # the client went away (""), or a 413
            if rejected:
                await self._reject(send, 413, rejected)
            return
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            detail = (
                f"body: not UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start}); send UTF-8 JSON"
            )
            await self._reject(send, 400, detail)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive, chunks: list[bytes]) -> str | None:
        """The body's chunks into ``chunks``; None when read whole, "" when the client went
        away, a 413's detail when it is over the limit."""
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return ""
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                return self._too_large(size, more)
        return None

    def _too_large(self, size: int, more: bool = False) -> str:
        got = f"{'over ' if more else ''}{size} bytes"
        return f"body: at most {self.max_bytes} bytes (max_body_bytes), got {got}"

    @staticmethod
    async def _reject(send: Send, status: int, detail: str) -> None:
        payload = json.dumps({"detail": detail}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def create_app(retriever: Retriever, num_docs: int, limits: ServerLimits | None = None) -> FastAPI:
    """The FastAPI app serving `retriever` (`num_docs` is reported by /health)."""
    limits = limits or ServerLimits()
    app = FastAPI(title="retrieval server (Search-R1 protocol)")
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(Exception, _failed)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "num_docs": num_docs}

    # A plain `def`: FastAPI runs it in its thread pool, so a search never blocks the
    # event loop, and JSONResponse skips FastAPI's slow generic encoder.
    @app.post("/retrieve")
    def retrieve(req: RetrieveRequest) -> JSONResponse:
        topk = _check(req, limits)
        try:
            results = retriever.search(req.queries, topk)
        except Exception as exc:
            # answered here: an exception that leaves the app (even with its 500 sent) makes
            # uvicorn drop the keep-alive connection, and a client that reuses it gets a
            # transport error in place of the 500 (1-7 requests in 1,000 here)
            return _failure(exc)
        if req.return_scores:
            body = [
                [
                    {"document": {"id": d.id, "contents": doc_contents(d)}, "score": d.score}
                    for d in docs
                ]
                for docs in results
            ]
        else:
            body = [[{"id": d.id, "contents": doc_contents(d)} for d in docs] for docs in results]
        return JSONResponse({"result": body})

    return app


def bind(host: str = "127.0.0.1", port: int = 8000) -> socket.socket:
    """A listening socket on `host:port`; an address in use is an `OSError` here, before the
    server announces anything."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


# Descriptors the server keeps beside its connections, over those open when it starts (the
# listening socket, logs, uvloop's own, a file a lookup opens).
FD_RESERVE = 32


def connection_cap(requested: int) -> int:
    """``requested``, or fewer where the open-file limit (``ulimit -n``) cannot hold that many
    connections beside the descriptors open now and ``FD_RESERVE`` more (with a warning)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit here
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    room = max(1, soft - in_use - FD_RESERVE)
    if requested <= room:
        return requested
    log.warning(
        "max_connections %d lowered to %d: the open-file limit (ulimit -n) is %d and %d are "
        "open; raise the limit to hold more connections",
        *(requested, room, soft, in_use),
    )
    return room


class _Bounded:
    """Over uvicorn's HTTP protocol (one instance a connection): the connection bounds of
    ``ServerLimits``. ``bounded_protocol`` makes the class, with its limits and the server's
    open connections (oldest first)."""

    limits: ServerLimits
    live: dict
    closed: dict  # connections closed by the bounds: {"cap": n, "idle": n}

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)
        self._idle_timer = None
        self.live[self] = None
        self._arm_idle()
        if len(self.live) > self.limits.max_connections:
            oldest = next((c for c in self.live if c is not self and c._is_idle()), None)
            (oldest or self)._close("cap")

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.live.pop(self, None)
        self._disarm_idle()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._is_idle():  # a request's headers are complete: the app has it
            self._disarm_idle()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._is_idle() and not self.transport.is_closing():
            self._arm_idle()

    def _is_idle(self) -> bool:
        """No request in progress: none yet, part of one's headers, or the last one answered."""
        return self.cycle is None or self.cycle.response_complete

    def _arm_idle(self) -> None:
        self._disarm_idle()
        self._idle_timer = self.loop.call_later(self.limits.idle_timeout_s, self._on_idle)

    def _disarm_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _on_idle(self) -> None:
        self._idle_timer = None
        if self._is_idle():
            self._close("idle")

    def _close(self, why: str) -> None:
        self.live.pop(self, None)
        self._disarm_idle()
        self.transport.close()
        self.closed[why] += 1
        n = self.closed[why]
        if why == "cap" and n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th, ...: a flood is a few lines
            cap = self.limits.max_connections
            log.warning("%d connection(s) closed to stay within max_connections %d", n, cap)


def bounded_protocol(limits: ServerLimits) -> type:
    """uvicorn's HTTP protocol class (httptools where installed, else h11) with ``limits``'
    connection bounds (``_Bounded``), for one server."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return type(
        "BoundedHTTPProtocol",
        (_Bounded, AutoHTTPProtocol),
        {"limits": limits, "live": {}, "closed": {"cap": 0, "idle": 0}},
    )


def server_config(app: ASGIApp, limits: ServerLimits | None = None, **kwargs: Any) -> Config:
    """The ``uvicorn.Config`` that serves ``app`` within ``limits``' connection bounds
    (``max_connections`` as given: ``serve`` first fits it to the open-file limit)."""
    import uvicorn

    limits = limits or ServerLimits()
    return uvicorn.Config(
        app,
        http=bounded_protocol(limits),
        timeout_keep_alive=limits.idle_timeout_s,
        log_level=kwargs.pop("log_level", "warning"),
        **kwargs,
    )


def serve(
    retriever: Retriever,
    num_docs: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Run the server until interrupted (loopback only unless `host` says otherwise), on `sock`
    when given (from `bind`), else on a socket bound here; within `limits`' connection bounds,
    `max_connections` lowered to what the open-file limit holds (``connection_cap``)."""
    import uvicorn

    if host not in LOOPBACK:
        log.warning("serving on %s: reachable from the network, with no authentication", host)
    sock = sock or bind(host, port)
    limits = limits or ServerLimits()
    limits = replace(limits, max_connections=connection_cap(limits.max_connections))
    app = create_app(retriever, num_docs, limits)
    uvicorn.Server(server_config(app, limits)).run(sockets=[sock])
