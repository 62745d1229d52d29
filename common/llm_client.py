"""An OpenAI-compatible chat client for teachers and controllers (vLLM's server, OpenAI, ...).

    client = LLMClient("http://127.0.0.1:8000/v1", "my-model", cache_dir="runs/cache/teacher")
    results = client.chat_many([[{"role": "user", "content": "Hi"}], ...])

``chat_many`` never raises: a request that still fails after its retries comes back as a
``ChatResult`` with ``error`` set. Requests run on a thread pool, at most ``max_concurrency`` in
flight per client (across concurrent ``chat_many`` calls too). Connection errors, timeouts, 429,
5xx and malformed bodies (not JSON, no ``choices``) are retried with exponential backoff
``backoff · 2^attempt`` seconds (or the server's ``Retry-After`` when longer); other 4xx answers
are not. ``timeout`` bounds each network wait; ``deadline`` bounds a whole attempt, so a server
that trickles bytes cannot hold a request past it. Successful results are cached on disk, one
JSON file per request, keyed by the sha256 of (base_url, model, messages, sampling parameters,
cache tag); a reply the caller's ``accept`` refuses (e.g. a verdict that does not parse) is
counted (``stats.rejected``) and never cached. A request repeated within one ``chat_many`` is
sent once, its repeats answered as cache hits. ``probe()`` asks the server before a run loads
anything: it answers, and it serves ``model``. The API key is read from the environment
variable ``api_key_env`` and never appears in repr, logs, errors or the cache.

``budget`` (``common.api_budget.ApiBudget``, shared by the clients of one command) is asked
before every HTTP request (retries included; a request answered from the cache is not one): a
request that would pass its cap is not sent, ``BudgetExceeded`` (a ``RunStopped``) is raised out
of ``chat_many`` instead, after the requests already in flight have come back and been cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from common.api_budget import ApiBudget, messages_chars, usd
from common.launcher import RunStopped
from common.redact import redact

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
_RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
_MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True)
class ChatResult:
    """One completion: ``text`` on success, else ``error``. A cached result reports the tokens
    and latency of the request that produced it."""

    text: str | None
    error: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cached: bool = False
    rejected: bool = False  # the caller's ``accept`` refused the text (not cached)


class EndpointError(RunStopped):
    """The endpoint cannot serve the run (``probe``): not answering, or not serving the model."""


THINK_END = "</think>"


def strip_reasoning(text: str) -> str:
    """The answer after a thinking model's reasoning: the text after the last ``</think>`` when
    the content holds one (a server started without a reasoning parser, e.g. GLM-4.7-Flash or
    Qwen3 in thinking mode), else ``text`` itself (the same object)."""
    if THINK_END not in text:
        return text
    return text.rpartition(THINK_END)[2].strip()


@dataclass
class ClientStats:
    """Totals over a client's life. Tokens, cost and latency count requests actually sent."""

    calls: int = 0  # chat_many items
    cache_hits: int = 0
    requests: int = 0  # HTTP attempts, retries included
    retries: int = 0
    failures: int = 0  # items that came back with an error
    rejected: int = 0  # replies the caller's ``accept`` refused
    reasoning_stripped: int = 0  # replies whose thinking block came inside the content
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _Failure(Exception):
    """A request that failed; ``retry`` says whether another attempt may succeed."""

    def __init__(self, message: str, retry: bool, retry_after: float = 0.0):
        super().__init__(redact(message))  # the URL may carry a credential
        self.retry = retry
        self.retry_after = retry_after


@dataclass(eq=False)
class LLMClient:
    """Chat completions against ``{base_url}/chat/completions`` (base_url ends in ``/v1``).

    Cost: ``price_prompt_per_mtok`` and ``price_completion_per_mtok`` in USD per million tokens.
    ``extra_body`` is merged into every request (e.g. vLLM's ``chat_template_kwargs``).
    """

    base_url: str
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = 8
    timeout: float = 60.0
    deadline: float | None = None  # seconds for a whole attempt; None: 3 x timeout
    retries: int = 3
    backoff: float = 1.0
    cache_dir: str | Path | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    price_prompt_per_mtok: float = 0.0
    price_completion_per_mtok: float = 0.0
    extra_body: dict[str, Any] | None = None
    budget: ApiBudget | None = field(default=None, repr=False, compare=False)
    stats: ClientStats = field(default_factory=ClientStats, init=False)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.deadline is None:
            self.deadline = 3 * self.timeout
        if self.deadline <= 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline}")
        self.base_url = self.base_url.rstrip("/")
        # Kept off the dataclass fields so that repr, asdict and the cache key never see it.
        self.__key = os.environ.get(self.api_key_env) or None
        headers = {"Authorization": f"Bearer {self.__key}"} if self.__key else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=self.timeout,
            limits=httpx.Limits(max_connections=self.max_concurrency),
        )
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"LLMClient(base_url={redact(self.base_url)!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r}, key_set={self.__key is not None})"
        )

    __str__ = __repr__

    def close(self) -> None:
        self._http.close()

    def sampling_params(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            **(self.extra_body or {}),
        }

    def cache_key(self, messages: Messages, cache_tag: str = "") -> str:
        """sha256 of the request's identity; ``cache_tag`` separates e.g. repeated runs."""
        identity = {
            "base_url": self.base_url,
            "model": self.model,
            "messages": messages,
            "params": self.sampling_params(),
            "tag": cache_tag,
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    def is_cached(self, messages: Messages, cache_tag: str = "") -> bool:
        """Whether the cache holds this request's answer (it would not be sent, nor paid)."""
        path = self._cache_path(self.cache_key(messages, cache_tag))
        return path is not None and path.exists()

    @property
    def prices(self) -> tuple[float, float]:
        return (self.price_prompt_per_mtok, self.price_completion_per_mtok)

    def chat_many(
        self,
        messages_list: list[Messages],
        cache_tag: str = "",
        accept: Callable[[str], bool] | None = None,
    ) -> list[ChatResult]:
        """One ``ChatResult`` per message list, in order. A failed request gives a result with
        ``error`` set; only malformed input (a caller's bug) raises, before any request.
        ``accept(text)``: False marks the result ``rejected`` and keeps it out of the cache (a
        cached entry it refuses is asked again). A request repeated in the list is sent once:
        its repeats get its answer as a cache hit (they are asked again only when it failed or
        was refused)."""
        for i, messages in enumerate(messages_list):
            _check_messages(messages, i)
        if not messages_list:
            return []
        keys = [self.cache_key(m, cache_tag) for m in messages_list]
        first: dict[str, int] = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        results: list[ChatResult | None] = [None] * len(messages_list)
        self._run_all(sorted(first.values()), messages_list, results, cache_tag, accept)
        again = []
        for i, key in enumerate(keys):
            if results[i] is not None:
                continue
            done = results[first[key]]
            if done is not None and done.error is None and not done.rejected:
                with self._lock:
                    self.stats.calls += 1
                    self.stats.cache_hits += 1
                results[i] = replace(done, cached=True)
            else:
                again.append(i)
        self._run_all(again, messages_list, results, cache_tag, accept)
        rejected = sum(r.rejected for r in results)
        if rejected:
            log.warning(
                "%d of %d replies from %s (model %s) were refused by the caller's check and not "
                "cached; first: %r",
                rejected, len(results), redact(self.base_url), self.model,
                next(r.text for r in results if r.rejected)[:200],
            )  # fmt: skip
        return results

    def chat(self, messages: Messages, cache_tag: str = "") -> ChatResult:
        return self.chat_many([messages], cache_tag)[0]

    def _run_all(
        self,
        indices: list[int],
        messages_list: list[Messages],
        results: list[ChatResult | None],
        cache_tag: str,
        accept: Callable[[str], bool] | None,
    ) -> None:
        """``results[i]`` for each of ``indices``, at most ``max_concurrency`` at a time."""
        if not indices:
            return
        workers = min(self.max_concurrency, len(indices))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="llm") as pool:
            done = pool.map(lambda i: self._chat_one(messages_list[i], cache_tag, accept), indices)
            for i, result in zip(indices, done, strict=True):
                results[i] = result

    def probe(self, timeout: float = 10.0) -> None:
        """Raise ``EndpointError`` in one line unless the server answers and serves ``model``:
        ``GET /models`` lists it (OpenAI, vLLM), or, where the server has no model list, a
        one-token chat request succeeds. Call before any model loads."""
        url = f"{self.base_url}/models"
        where = f"{redact(self.base_url)} (model {self.model})"
        try:
            response = self._http.get(url, timeout=timeout)
        except httpx.HTTPError as e:
            raise EndpointError(f"{where} is not answering: {type(e).__name__}: {e}") from e
        if response.status_code == 200:
            try:
                served = [m["id"] for m in response.json()["data"]]
            except (ValueError, KeyError, TypeError):
                served = None
            if served is not None:
                if self.model not in served:
                    raise EndpointError(f"{where}: the server serves {served}, not {self.model!r}")
                return
        elif response.status_code in (401, 403):
            raise EndpointError(
                f"{where} refused the credentials (HTTP {response.status_code}): set "
                f"{self.api_key_env}"
            )
        body = {"model": self.model, "messages": [{"role": "user", "content": "ping"}],
                "max_tokens": 1}  # fmt: skip
        try:
            self._request(body)
        except _Failure as e:
            raise EndpointError(f"{where} cannot answer a chat request: {e}") from e

    # --- one request ---------------------------------------------------------------------

    def _chat_one(
        self, messages: Messages, cache_tag: str, accept: Callable[[str], bool] | None
    ) -> ChatResult:
        key = self.cache_key(messages, cache_tag)
        cached = self._cache_read(key)
        if cached is not None and accept is not None and not accept(cached.text or ""):
            cached = None  # written before the check existed: asked again
        with self._lock:
            self.stats.calls += 1
            self.stats.cache_hits += cached is not None
        if cached is not None:
            return cached
        result = self._request_with_retries(messages)
        if result.error is None and accept is not None and not accept(result.text or ""):
            with self._lock:
                self.stats.rejected += 1
            return replace(result, rejected=True)
        if result.error is None:
            self._cache_write(key, result)
        return result

    def _request_with_retries(self, messages: Messages) -> ChatResult:
        body = {"model": self.model, "messages": messages, **self.sampling_params()}
        chars = messages_chars(messages)
        for attempt in range(self.retries + 1):
            bound, cost = 0.0, 0.0
            if self.budget is not None:  # raises BudgetExceeded: this request is not sent
                prompt_bound = self.budget.prompt_tokens_bound(chars)
                bound = usd(prompt_bound, self.max_tokens, self.prices)
                self.budget.reserve(bound)
            start = time.perf_counter()
            result = None
            try:
                with self._slots:
                    result = self._request(body)
                latency = time.perf_counter() - start
                cost = self._account(result, latency)
                return ChatResult(
                    result["text"], None, result["prompt"], result["completion"], latency
                )
            except _Failure as failure:
                with self._lock:
                    self.stats.requests += 1
                    self.stats.latency_s += time.perf_counter() - start
                error = self._redact(str(failure))
                if not failure.retry or attempt == self.retries:
                    with self._lock:
                        self.stats.failures += 1
                    log.warning("chat request failed after %d attempt(s): %s", attempt + 1, error)
                    return ChatResult(None, error)
                delay = min(max(self.backoff * 2**attempt, failure.retry_after), _MAX_RETRY_AFTER_S)
                log.info("chat request failed (%s); retry %d in %.2fs", error, attempt + 1, delay)
                with self._lock:
                    self.stats.retries += 1
                time.sleep(delay)
            finally:
                if self.budget is not None:
                    prompt = result["prompt"] if result is not None else 0
                    self.budget.settle(bound, cost, chars, prompt)
        raise AssertionError("unreachable: the last attempt returns")

    def _request(self, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/chat/completions"
        end = time.monotonic() + self.deadline
        try:
            with self._http.stream("POST", url, json=body) as response:
                raw = bytearray()
                for chunk in response.iter_bytes():
                    raw += chunk
                    if time.monotonic() > end:
                        raise _Failure(
                            f"no whole answer within the {self.deadline:g}s deadline at {url} "
                            f"({len(raw)} bytes read)",
                            True,
                        )
        except httpx.TimeoutException as e:
            raise _Failure(
                f"timeout after {self.timeout}s ({type(e).__name__}) at {url}", True
            ) from e
        except httpx.TransportError as e:
            raise _Failure(f"connection error at {url}: {type(e).__name__}: {e}", True) from e
        text_body = raw.decode("utf-8", errors="replace")
        if response.status_code != 200:
            retry = response.status_code in _RETRY_STATUS
            raise _Failure(
                f"HTTP {response.status_code} from {url}: {text_body[:300]}",
                retry,
                _retry_after(response) if retry else 0.0,
            )
        try:
            data = json.loads(text_body)
            text = data["choices"][0]["message"]["content"]
            usage = data.get("usage") or {}
            prompt, completion = (
                int(usage.get("prompt_tokens", 0)),
                int(usage.get("completion_tokens", 0)),
            )
        except (ValueError, KeyError, IndexError, TypeError) as e:
            # a proxy's or an overloaded server's broken answer: another attempt may succeed
            raise _Failure(f"malformed response from {url}: {type(e).__name__}: {e}", True) from e
        if not isinstance(text, str):
            raise _Failure(f"response from {url} has no message content", True)
        answer = strip_reasoning(text)
        if answer is not text:
            with self._lock:
                self.stats.reasoning_stripped += 1
        return {"text": answer, "prompt": prompt, "completion": completion}

    def _account(self, result: dict[str, Any], latency: float) -> float:
        """Count an answered request; returns its cost in USD."""
        cost = usd(result["prompt"], result["completion"], self.prices)
        with self._lock:
            s = self.stats
            s.requests += 1
            s.latency_s += latency
            s.prompt_tokens += result["prompt"]
            s.completion_tokens += result["completion"]
            s.cost_usd += cost
        return cost

    def _redact(self, text: str) -> str:
        # A server may echo the credentials it rejected.
        return text.replace(self.__key, "***") if self.__key else text

    # --- cache ---------------------------------------------------------------------------

    def _cache_path(self, key: str) -> Path | None:
        return None if self.cache_dir is None else Path(self.cache_dir) / key[:2] / f"{key}.json"

    def _cache_read(self, key: str) -> ChatResult | None:
        path = self._cache_path(key)
        if path is None or not path.exists():
            return None
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return ChatResult(
                d["text"], None, d["prompt_tokens"], d["completion_tokens"], d["latency_s"], True
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable cache entry %s (%s); asking again", path, e)
            return None

    def _cache_write(self, key: str, result: ChatResult) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {k: v for k, v in asdict(result).items() if k not in ("error", "cached")}
        # Written next to the target and renamed, so a reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f)
            os.replace(tmp, path)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            log.warning("cannot write cache entry %s: %s", path, e)


def _check_messages(messages: Any, index: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages_list[{index}] must be a non-empty list of messages")
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            raise ValueError(f"messages_list[{index}][{j}] must be a dict with a string 'role'")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages_list[{index}][{j}] must have a string 'content'")


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", 0)))
    except ValueError:  # an HTTP date: fall back to our own backoff
        return 0.0
