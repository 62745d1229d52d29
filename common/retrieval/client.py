"""Client of a Search-R1-protocol retrieval server (this project's or Search-R1's own)."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from common.launcher import RunStopped
from common.redact import redact
from common.retrieval.base import CorpusError, Doc, parse_row

log = logging.getLogger(__name__)

MAX_QUERY_CHARS = 2048  # the server's default per-query limit (ServerLimits.max_query_chars)
_MAX_BACKOFF_S = 30.0


class RetrievalError(RuntimeError):
    """The retrieval server could not be reached or gave an unusable answer (a credential in
    the server's URL is masked in the message)."""

    def __init__(self, message: str):
        super().__init__(redact(message))


class RetrievalOutage(RetrievalError, RunStopped):
    """The server stayed unreachable (or answered 5xx) past the client's retries and total
    wait: the run stops in one line; its checkpoints stay."""


class RetrievalRejected(RetrievalError, RunStopped):
    """The server refused a request (a 4xx): asking again cannot help, so the run stops in one
    line naming the URL, the server's reason and the setting to change; its checkpoints stay."""


# What to change for each refusal of this project's server (its 4xx `detail` starts with the
# field); Search-R1's own server and others get the generic advice.
_MORE_CHARS = "restart the server with --max-query-chars of at least {chars} (the client cuts "
_REJECTED_ADVICE = (
    ("topk:", "lower the run's topk, or restart the server with a larger --max-topk"),
    ("queries:", "restart the server with --max-queries of at least {batch} (the client batch)"),
    ("queries.", _MORE_CHARS + "queries to it)"),
    ("body:", "restart the server with a larger --max-body-bytes"),
)


def parse_response(body: Any, num_queries: int, url: str) -> list[list[Doc]]:
    """Docs from a `/retrieve` answer, with scores (`{"document", "score"}` items) or
    without (bare `{"id", "contents"}` items, score 0.0)."""
    result = body.get("result") if isinstance(body, dict) else None
    if not isinstance(result, list) or len(result) != num_queries:
        raise RetrievalError(
            f"{url}: expected {{'result': [{num_queries} lists]}}, got {body!r:.200}"
        )
    out = []
    for i, items in enumerate(result):
        if not isinstance(items, list):
            raise RetrievalError(f"{url}: result[{i}] is not a list")
        docs = []
        for j, item in enumerate(items):
            where = f"{url}: result[{i}][{j}]"
            scored = isinstance(item, dict) and "document" in item
            try:
                doc = parse_row(item["document"] if scored else item, where)
            except CorpusError as e:
                raise RetrievalError(str(e)) from None
            score = item.get("score", 0.0) if scored else 0.0
            if not isinstance(score, int | float):
                raise RetrievalError(f"{where}: score must be a number, got {score!r}")
            docs.append(Doc(doc.id, doc.title, doc.text, float(score)))
        out.append(docs)
    return out


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    return str(body.get("detail", body) if isinstance(body, dict) else body)


def probe_retrieval(url: str) -> None:
    """``HTTPRetriever(url).probe()`` when ``url`` is set (a run with a retrieval server), on
    every rank, before any model loads."""
    if url:
        with HTTPRetriever(url, timeout=10.0) as client:
            client.probe()


class HTTPRetriever:
    """The `Retriever` protocol over HTTP: one request per `batch_size` queries.

    Connection errors, timeouts and 5xx answers are retried, waiting `backoff * 2**attempt`
    seconds (at most 30 s a wait), up to `retries` times and while the time since the first
    failure stays under `max_wait` seconds (a server restart takes 13-22 s; the default waits
    minutes). Past them, a `RetrievalOutage` (a `RunStopped`: one line, the run's checkpoints
    intact). A 4xx is not retried: a `RetrievalRejected` (also a `RunStopped`) naming the URL,
    the server's reason and what to change. A query longer than
    `max_query_chars` (the server's limit) is cut to it and counted (`cut_queries`), so one
    runaway policy query cannot end a run.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 20,
        backoff: float = 0.5,
        batch_size: int = 512,
        max_wait: float = 300.0,
        max_query_chars: int = MAX_QUERY_CHARS,
    ):
        # Search-R1 configs give the endpoint itself; a bare server address works too.
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.retries = retries
        self.backoff = backoff
        self.batch_size = batch_size
        self.max_wait = max_wait
        self.max_query_chars = max_query_chars
        self.cut_queries = 0
        self._client = httpx.Client(timeout=timeout)

    def probe(self) -> None:
        """Raise ``RetrievalOutage`` in one line unless the server answers one query now (no
        retries: called before a run loads anything). A query, not ``/health``: Search-R1's own
        server has only ``/retrieve``."""
        payload = {"queries": ["probe"], "topk": 1, "return_scores": True}
        try:
            response = self._client.post(self.url, json=payload)
            if response.status_code != 200:
                raise RetrievalError(f"HTTP {response.status_code}: {_detail(response)}")
            parse_response(response.json(), 1, self.url)
        except (httpx.HTTPError, ValueError, RetrievalError) as e:
            raise RetrievalOutage(
                f"retrieval server {self.url} does not answer a one-query probe: "
                f"{type(e).__name__}: {e}"
            ) from None

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        long = [i for i, q in enumerate(queries) if len(q) > self.max_query_chars]
        if long:
            self.cut_queries += len(long)
            log.warning(
                "retrieval: %d of %d queries over %d characters cut to it (%d cut so far; the "
                "first was %d characters)",
                len(long),
                len(queries),
                self.max_query_chars,
                self.cut_queries,
                len(queries[long[0]]),
            )
            queries = [q[: self.max_query_chars] for q in queries]
        out: list[list[Doc]] = []
        for start in range(0, len(queries), self.batch_size):
            out.extend(self._post(queries[start : start + self.batch_size], k))
        return out

    def _post(self, queries: list[str], k: int) -> list[list[Doc]]:
        payload = {"queries": queries, "topk": k, "return_scores": True}
        first_failure = None
        attempt = 0
        while True:
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TransportError as e:
                failure = f"{type(e).__name__}: {e}"
            else:
                if response.status_code < 500:
                    break
                failure = f"HTTP {response.status_code}: {response.text[:200]}"
            now = time.monotonic()
            first_failure = first_failure if first_failure is not None else now
            delay = min(self.backoff * 2**attempt, _MAX_BACKOFF_S)
            if attempt >= self.retries or now - first_failure + delay > self.max_wait:
                raise RetrievalOutage(
                    f"retrieval server {self.url} failed {attempt + 1} times over "
                    f"{now - first_failure:.0f} s (retries {self.retries}, max_wait "
                    f"{self.max_wait:g} s); last: {failure}"
                )
            if attempt == 0:
                log.warning(
                    "retrieval server %s: %s; retrying for up to %g s",
                    redact(self.url),
                    failure,
                    self.max_wait,
                )
            time.sleep(delay)
            attempt += 1
        if response.status_code >= 400:
            detail = " ".join(_detail(response).split())
            advice = next(
                (a for prefix, a in _REJECTED_ADVICE if detail.startswith(prefix)),
                "check that the server's limits admit the run's requests",
            ).format(batch=self.batch_size, chars=self.max_query_chars)
            longest = max(map(len, queries), default=0)
            raise RetrievalRejected(
                f"retrieval server {self.url} rejected the request (HTTP "
                f"{response.status_code}): {detail} ({len(queries)} quer"
                f"{'y' if len(queries) == 1 else 'ies'}, the longest {longest} characters, "
                f"topk {k}); {advice}"
            )
        try:
            body = response.json()
        except ValueError:
            raise RetrievalError(
                f"{self.url}: answer is not JSON: {response.text[:200]!r}"
            ) from None
        return parse_response(body, len(queries), self.url)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
