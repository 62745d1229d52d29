"""HTTP retrieval server speaking Search-R1's protocol, so either side can be swapped.

`POST /retrieve` takes `{"queries": [...], "topk": k, "return_scores": bool}` (`topk`
optional, the server's default; `return_scores` false by default) and answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` with scores or
`{"result": [[{"id", "contents"}, ...], ...]}` without. `GET /health` answers
`{"status": "ok", "num_docs": N}`. A bad request gets a 4xx with a JSON `detail` naming the
field (an unknown field is one: `"topK"` is not `"topk"`); a body over `max_body_bytes` gets a
413 before it is read whole, one that is not UTF-8 a 400; the server keeps serving.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.retrieval.base import Retriever, doc_contents

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerLimits:
    """Per-request bounds; requests beyond them get a 422 (a body over max_body_bytes: 413)."""

    default_topk: int = 3
    max_queries: int = 512
    max_query_chars: int = 2048
    max_topk: int = 100
    # 512 queries of 2048 characters, each escaped as JSON's \uXXXX (6 bytes): 6 MiB and the
    # envelope. The defaults fit together: any request within the other limits is accepted.
    max_body_bytes: int = 8 * 2**20


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
    """ASGI middleware: read the request body (at most `max_bytes` of it) before the app sees
    it; a larger one gets a 413 without being read further (a declared Content-Length over the
    limit: without reading any), a body that is not UTF-8 a 400 naming the first bad byte."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"").decode("latin-1").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, 413, self._too_large(int(declared)))
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._reject(send, 413, self._too_large(size, more))
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
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
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


def serve(
    retriever: Retriever,
    num_docs: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Run the server until interrupted (loopback only unless `host` says otherwise), on `sock`
    when given (from `bind`), else on a socket bound here."""
    import uvicorn

    if host not in LOOPBACK:
        log.warning("serving on %s: reachable from the network, with no authentication", host)
    sock = sock or bind(host, port)
    app = create_app(retriever, num_docs, limits)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
