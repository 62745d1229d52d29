"""HTTP retrieval server speaking Search-R1's protocol, so either side can be swapped.

`POST /retrieve` takes `{"queries": [...], "topk": k, "return_scores": bool}` (`topk`
optional, the server's default; `return_scores` false by default) and answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` with scores or
`{"result": [[{"id", "contents"}, ...], ...]}` without. `GET /health` answers
`{"status": "ok", "num_docs": N}`. A bad request gets a 4xx with a JSON `detail` naming the
field; the server keeps serving.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from common.retrieval.base import Retriever, doc_contents

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServerLimits:
    """Per-request bounds; requests beyond them get a 422."""

    default_topk: int = 3
    max_queries: int = 512
    max_query_chars: int = 2048
    max_topk: int = 100


class RetrieveRequest(BaseModel):
    """Search-R1's request body; strict, so `"3"` is not a topk and `1` is not a query."""

    model_config = ConfigDict(strict=True)

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
    err = exc.errors()[0]
    if err["type"] == "json_invalid":
        reason = err.get("ctx", {}).get("error", "")
        return JSONResponse({"detail": f"body: invalid JSON ({reason})"}, status_code=400)
    field = ".".join(str(part) for part in err["loc"] if part != "body")
    if not field:  # the body as a whole: not an object, or not sent as JSON
        hint = "send a JSON object with Content-Type: application/json"
        return JSONResponse({"detail": f"body: {err['msg']}; {hint}"}, status_code=422)
    return JSONResponse({"detail": f"{field}: {err['msg']}"}, status_code=422)


async def _failed(request: Request, exc: Exception) -> JSONResponse:
    log.exception("retrieval failed")
    return JSONResponse(
        {"detail": f"retrieval failed: {type(exc).__name__}: {exc}"}, status_code=500
    )


def create_app(retriever: Retriever, num_docs: int, limits: ServerLimits | None = None) -> FastAPI:
    """The FastAPI app serving `retriever` (`num_docs` is reported by /health)."""
    limits = limits or ServerLimits()
    app = FastAPI(title="retrieval server (Search-R1 protocol)")
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
        results = retriever.search(req.queries, topk)
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


def serve(
    retriever: Retriever,
    num_docs: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    limits: ServerLimits | None = None,
) -> None:
    """Run the server until interrupted (loopback only unless `host` says otherwise)."""
    import uvicorn

    if host not in LOOPBACK:
        log.warning("serving on %s: reachable from the network, with no authentication", host)
    uvicorn.run(create_app(retriever, num_docs, limits), host=host, port=port, log_level="warning")
