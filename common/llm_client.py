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
counted (``stats.rejected``), asked again up to ``reasks`` times, and never cached. A request
repeated within one ``chat_many`` is sent once, its repeats answered as cache hits. ``probe()``
asks the server before a run loads anything, retried as a request is: it answers, and it serves
``model``. The API key is read from the environment variable ``api_key_env`` and never appears
in repr, logs, errors or the cache.

A reply's ``model`` field is checked against ``model`` (``model_matches``: the same name, the
name behind a provider's prefix, or a dated snapshot of it; ``reply_models`` adds names): a
reply from another model (a restarted server, a proxy that routes elsewhere) is refused, not
retried, never cached, and counted (``stats.wrong_model``); a reply without the field is taken.
A reply without ``usage`` is counted by ``tokenizer`` (``common.api_budget.TokenCounter``; none
configured: an upper bound from the text's bytes) and counted in ``stats.usage_missing``.

``budget`` (``common.api_budget.ApiBudget``, shared by the clients of one command) is asked
before every HTTP request (retries and re-asks included; a request answered from the cache is
not one), at its worst case (the prompt's bound and ``max_tokens``): a request that would pass
its cap is not sent, ``BudgetExceeded`` (a ``RunStopped``) is raised out of ``chat_many``
instead, after the requests already in flight have come back and been cached. An attempt that
fails after the server may have generated (a read timeout, the deadline, a broken body) is
counted at its bound; one refused before (a connection error, an HTTP error status) at $0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from common.api_budget import ApiBudget, TokenCounter, usd
from common.jsonl import write_atomic
from common.launcher import RunStopped
from common.redact import redact

log = logging.getLogger(__name__)

Messages = list[dict[str, str]]
_RETRY_STATUS = frozenset({429}) | frozenset(range(500, 600))
# errors raised before the request reached the server: nothing was generated or billed
_UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
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
    rejected: bool = False  # the caller's ``accept`` refused the text, every ask (not cached)
    model: str = ""  # the model the reply names ("" where it names none)
    wrong_model: bool = False  # refused: the reply came from another model (``error`` says which)


class EndpointError(RunStopped):
    """The endpoint cannot serve the run (``probe``): not answering, or not serving the model."""


THINK_END = "</think>"
_DATE_SUFFIX = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")


def model_matches(configured: str, replied: str, also: Sequence[str] = ()) -> bool:
    """Whether a reply's ``model`` field names the ``configured`` model, by the rule the
    providers' documented names need (case ignored):

    - the same name (vLLM echoes the served model name asked for);
    - the name behind a provider's prefix, either way round (OpenRouter's ``openai/gpt-4o`` for
      ``gpt-4o``, a hub id ``Qwen/Qwen3-8B`` for ``Qwen3-8B``; two different prefixes differ);
    - a dated snapshot of the name, ``-YYYY-MM-DD`` or ``-YYYYMMDD`` (OpenAI's ``gpt-4o`` answers
      as ``gpt-4o-2024-08-06``, Anthropic's as ``...-20241022``); not the other way round (an
      undated name may be another snapshot);
    - a name in ``also`` (``teacher.reply_models``), or anything where ``also`` holds ``*``.
    """
    want, got = configured.strip().lower(), replied.strip().lower()
    extra = {a.strip().lower() for a in also}
    if "*" in extra or got in extra:
        return True
    for name in {got, _DATE_SUFFIX.sub("", got)}:
        if name == want or name.endswith("/" + want) or want.endswith("/" + name):
            return True
    return False


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
    rejected: int = 0  # replies the caller's ``accept`` refused (each ask)
    reasked: int = 0  # requests sent again after a refused reply
    wrong_model: int = 0  # replies refused for naming another model
    usage_missing: int = 0  # answers without ``usage``: their tokens counted here
    reasoning_stripped: int = 0  # replies whose thinking block came inside the content
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _Failure(Exception):
    """A request that failed; ``retry`` says whether another attempt may succeed."""

    def __init__(
        self,
        message: str,
        retry: bool,
        retry_after: float = 0.0,
        *,
        at_bound: bool = False,
        tokens: tuple[int, int] = (0, 0),
        wrong_model: str = "",
    ):
        super().__init__(redact(message))  # the URL may carry a credential
        self.retry = retry
        self.retry_after = retry_after
        self.at_bound = at_bound  # the server may have generated and billed: cost its bound
        self.tokens = tokens  # (prompt, completion) of an answer refused after it came
        self.wrong_model = wrong_model  # the other model a refused answer came from


@dataclass(eq=False)
class LLMClient:
    """Chat completions against ``{base_url}/chat/completions`` (base_url ends in ``/v1``).

    Cost: ``price_prompt_per_mtok`` and ``price_completion_per_mtok`` in USD per million tokens.
    ``extra_body`` is merged into every request (e.g. vLLM's ``chat_template_kwargs``).
    ``reasks``: times a reply the caller's ``accept`` refuses is asked again (0: none).
    ``reply_models``: names a reply's ``model`` may carry besides ``model_matches``'s.
    ``tokenizer``: the served model's tokenizer (object, folder or hub id) for the tokens of an
    answer without ``usage`` and a request's bound before it is sent; None: UTF-8 bytes.
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
    reasks: int = 0
    reply_models: Sequence[str] = ()
    tokenizer: Any = field(default=None, repr=False, compare=False)
    budget: ApiBudget | None = field(default=None, repr=False, compare=False)
    stats: ClientStats = field(default_factory=ClientStats, init=False)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.reasks < 0:
            raise ValueError(f"reasks must be >= 0, got {self.reasks}")
        self.reply_models = tuple(self.reply_models)
        self.counter = TokenCounter(self.tokenizer)
        self._prompt_scale = 1.0  # the most reported / counted prompt tokens seen (>= 1)
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
                rejected,
                len(results),
                redact(self.base_url),
                self.model,
                next(r.text for r in results if r.rejected)[:200],
            )
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
        one-token chat request succeeds (from ``model``: ``model_matches``). A server that does
        not answer, times out, or answers 429 or 5xx is asked again as a request is (``retries``,
        ``backoff``, ``Retry-After``); a refusal (401/403, another model) stops at once. Call
        before any model loads."""
        where = f"{redact(self.base_url)} (model {self.model})"
        for attempt in range(self.retries + 1):
            try:
                self._probe_once(timeout, where)
                return
            except _Failure as failure:
                if attempt == self.retries:
                    tries = f" ({attempt + 1} attempts)" if attempt else ""
                    raise EndpointError(f"{where} {self._redact(str(failure))}{tries}") from None
                delay = min(max(self.backoff * 2**attempt, failure.retry_after), _MAX_RETRY_AFTER_S)
                why = self._redact(str(failure))
                log.warning("probe of %s: %s; again in %.2fs", where, why, delay)
                time.sleep(delay)

    def _probe_once(self, timeout: float, where: str) -> None:
        """One probe: ``EndpointError`` for a refusal, ``_Failure`` for what may pass."""
        url = f"{self.base_url}/models"
        try:
            response = self._http.get(url, timeout=timeout)
        except httpx.HTTPError as e:
            raise _Failure(f"is not answering: {type(e).__name__}: {e}", True) from e
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
        elif response.status_code in _RETRY_STATUS:
            raise _Failure(
                f"is not answering: HTTP {response.status_code} from {url}",
                True,
                _retry_after(response),
            )
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": 1,
        }
        try:
            self._request(body)
        except _Failure as e:
            if e.retry:
                raise _Failure(f"cannot answer a chat request: {e}", True, e.retry_after) from e
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
        for ask in range(self.reasks + 1):
            result = self._request_with_retries(messages)
            if result.error is not None or accept is None or accept(result.text or ""):
                break
            with self._lock:
                self.stats.rejected += 1
                self.stats.reasked += ask < self.reasks
            if ask < self.reasks:
                shown = (result.text or "")[:80]
                log.info("refused reply %r: asked again (%d of %d)", shown, ask + 1, self.reasks)
        else:  # refused every time
            return replace(result, rejected=True)
        if result.error is None:
            self._cache_write(key, result)
        return result

    def _request_with_retries(self, messages: Messages) -> ChatResult:
        body = {"model": self.model, "messages": messages, **self.sampling_params()}
        counted = self.counter.prompt(messages) if self.budget is not None else 0
        for attempt in range(self.retries + 1):
            bound, cost = 0.0, 0.0
            if self.budget is not None:  # raises BudgetExceeded: this request is not sent
                # the worst case: the prompt's bound (the tokenizer's count, or the bytes, times
                # the most the server has reported over it) and every completion token
                prompt_bound = math.ceil(counted * self._prompt_scale)
                bound = usd(prompt_bound, self.max_tokens, self.prices)
                self.budget.reserve(bound)
            start = time.perf_counter()
            result = None
            try:
                with self._slots:
                    result = self._request(body)
                latency = time.perf_counter() - start
                cost = self._account(result, latency)
                if result["reported"] and counted:  # a tokenizer that undercounts the server's
                    with self._lock:
                        self._prompt_scale = max(self._prompt_scale, result["prompt"] / counted)
                return ChatResult(
                    result["text"],
                    None,
                    result["prompt"],
                    result["completion"],
                    latency,
                    model=result["model"],
                )
            except _Failure as failure:
                cost = bound if failure.at_bound else usd(*failure.tokens, self.prices)
                with self._lock:
                    self.stats.requests += 1
                    self.stats.latency_s += time.perf_counter() - start
                    self.stats.wrong_model += bool(failure.wrong_model)
                error = self._redact(str(failure))
                if not failure.retry or attempt == self.retries:
                    with self._lock:
                        self.stats.failures += 1
                    log.warning("chat request failed after %d attempt(s): %s", attempt + 1, error)
                    other = failure.wrong_model
                    return ChatResult(None, error, model=other, wrong_model=bool(other))
                delay = min(max(self.backoff * 2**attempt, failure.retry_after), _MAX_RETRY_AFTER_S)
                log.info("chat request failed (%s); retry %d in %.2fs", error, attempt + 1, delay)
                with self._lock:
                    self.stats.retries += 1
                time.sleep(delay)
            finally:
                if self.budget is not None:
                    self.budget.settle(bound, cost)
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
                            at_bound=True,
                        )
        except httpx.TimeoutException as e:
            raise _Failure(
                f"timeout after {self.timeout}s ({type(e).__name__}) at {url}",
                True,
                at_bound=not isinstance(e, _UNSENT),
            ) from e
        except httpx.TransportError as e:
            raise _Failure(
                f"connection error at {url}: {type(e).__name__}: {e}",
                True,
                at_bound=not isinstance(e, _UNSENT),
            ) from e
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
            message = data["choices"][0]["message"]
            text = message["content"]
            usage = data.get("usage")
            reported = isinstance(usage, dict) and bool(
                {"prompt_tokens", "completion_tokens"} & usage.keys()
            )
            if reported:
                prompt, completion = (
                    int(usage.get("prompt_tokens") or 0),
                    int(usage.get("completion_tokens") or 0),
                )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            # a proxy's or an overloaded server's broken answer: another attempt may succeed
            raise _Failure(
                f"malformed response from {url}: {type(e).__name__}: {e}", True, at_bound=True
            ) from e
        if not isinstance(text, str):
            raise _Failure(f"response from {url} has no message content", True, at_bound=True)
        if not reported:  # counted here: the tokenizer's count, or the bytes' bound
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
            prompt = self.counter.prompt(body["messages"])
            completion = min(
                self.counter.text(text + (reasoning if isinstance(reasoning, str) else "")),
                int(body.get("max_tokens") or self.max_tokens),
            )
            with self._lock:
                self.stats.usage_missing += 1
        model = data.get("model")
        model = model if isinstance(model, str) else ""
        if model and not model_matches(self.model, model, self.reply_models):
            raise _Failure(
                f"the reply from {url} came from model {model!r}, not {self.model!r} (a "
                "restarted server or a proxy serving another model; names a reply may carry: "
                "common.llm_client.model_matches)",
                False,
                tokens=(prompt, completion),
                wrong_model=model,
            )
        answer = strip_reasoning(text)
        if answer is not text:
            with self._lock:
                self.stats.reasoning_stripped += 1
        return {
            "text": answer,
            "prompt": prompt,
            "completion": completion,
            "model": model,
            "reported": reported,
        }

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
                d["text"],
                None,
                d["prompt_tokens"],
                d["completion_tokens"],
                d["latency_s"],
                True,
                model=str(d.get("model", "")),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring unreadable cache entry %s (%s); asking again", path, e)
            return None

    def _cache_write(self, key: str, result: ChatResult) -> None:
        path = self._cache_path(key)
        if path is None:
            return
        skip = ("error", "cached", "rejected", "wrong_model")  # never true of a cached answer
        entry = {k: v for k, v in asdict(result).items() if k not in skip}
        try:  # atomic: a reader never sees half a file
            write_atomic(path, json.dumps(entry))
        except OSError as e:
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
