"""What a command's paid LLM calls will cost, a cap that stops it cleanly, and calls made once
over a launcher's ranks.

- ``RequestGroup`` / ``estimate_text``: the estimate printed before a command's first paid call:
  calls (an upper bound), prompt tokens (measured characters of the prompts the command builds,
  / ``CHARS_PER_TOKEN``), completion tokens (an upper bound: calls x ``max_tokens``), USD where
  prices are set, and how many of the calls are already in the disk cache where that is known
  before calling (a cached request is not paid).
- ``ApiBudget``: one per command, shared by its ``LLMClient``s. Before each HTTP request a client
  sends (a retry too; a request answered from the cache is not one) the budget reserves the
  request; the request that would pass ``max_calls`` requests, or ``max_usd`` dollars (spent
  plus the in-flight requests' bounds plus this one's), is not sent: ``BudgetExceeded`` (a
  ``RunStopped``: the CLI prints one line and exits 3) is raised instead, and every later
  request is refused too. Answers that came back are in the client's disk cache, so a rerun
  with a higher cap pays only for the rest. A request is reserved at its worst case, its
  prompt's tokens bound (``TokenCounter.prompt``) plus ``max_tokens``, so no request that would
  pass ``max_usd`` is sent.
- ``max_calls_field`` / ``max_usd_field`` / ``prices_field`` / ``check_priced``: the config
  keys of a command's cap (``max_api_calls``, ``max_api_usd``, each client's ``*_usd_per_mtok``)
  and the check that a dollar cap has prices, written once for every command that pays.
- ``TokenCounter``: a request's tokens where the endpoint sends no ``usage`` (some servers and
  proxies do not), and the prompt's bound before it is sent: through the model's tokenizer where
  one is configured (its chat template, else each message's tokens plus ``MESSAGE_TOKENS`` and
  ``TEMPLATE_TOKENS``), else the UTF-8 bytes of the text plus the same allowance, an upper bound
  for the byte-level BPE and SentencePiece tokenizers served models use (a token holds at least
  one byte), about 4x an English text's real tokens: without usage and without a tokenizer a
  request is counted at that bound, so the cap holds and stops early.
- ``on_rank_zero``: a function's result computed by rank 0 alone and given to every rank (its
  ``RunStopped`` raised on every rank), so a launcher's N ranks pay for a request once, not N
  times.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from common.launcher import RunStopped

CHARS_PER_TOKEN = 4  # the estimate's prompt tokens: characters / 4 (English text, BPE tokenizers)
# The tokens a chat template adds at most, beyond the messages' text: a default system prompt and
# the generation prompt once a request, role markers around each message.
TEMPLATE_TOKENS = 64
MESSAGE_TOKENS = 8
T = TypeVar("T")


def tokens_from_chars(chars: int) -> int:
    """Estimated tokens of ``chars`` characters of prompt (``CHARS_PER_TOKEN`` a token)."""
    return math.ceil(chars / CHARS_PER_TOKEN)


def messages_chars(messages: Sequence[dict[str, str]]) -> int:
    """Characters of a chat request's contents (what its prompt tokens are estimated from)."""
    return sum(len(m.get("content", "")) for m in messages)


class TokenCounter:
    """Tokens of a chat request and of a reply, counted where the endpoint sends no ``usage``,
    and the bound a request's prompt is reserved at before it is sent.

    ``tokenizer``: an HF tokenizer, or its folder or hub id (loaded here), or None. With one, a
    prompt is counted through its chat template (without one: each message's tokens plus
    ``MESSAGE_TOKENS``, plus ``TEMPLATE_TOKENS``), exact when it is the served model's; without
    one, from characters: the UTF-8 bytes of the text plus the same allowance, an upper bound for
    byte-level BPE and SentencePiece tokenizers (a token holds at least one byte), about 4x an
    English text's real tokens."""

    def __init__(self, tokenizer: Any = None):
        if isinstance(tokenizer, str | Path):
            tokenizer = str(tokenizer)
            if tokenizer:
                from transformers import AutoTokenizer

                try:
                    tokenizer = AutoTokenizer.from_pretrained(tokenizer)
                except (OSError, ValueError) as e:
                    raise ValueError(f"cannot load the tokenizer {tokenizer!r}: {e}") from e
            else:
                tokenizer = None
        self.tokenizer = tokenizer

    @property
    def how(self) -> str:
        """What the counts are, in words (for a log line)."""
        if self.tokenizer is None:
            return "UTF-8 bytes + the template allowance (an upper bound)"
        return f"the tokenizer {getattr(self.tokenizer, 'name_or_path', '') or '(given)'}"

    def prompt(self, messages: Sequence[dict[str, str]]) -> int:
        """The prompt tokens of ``messages`` (with a tokenizer: exact for the served model's)."""
        allowance = TEMPLATE_TOKENS + MESSAGE_TOKENS * len(messages)
        if self.tokenizer is None:
            return sum(utf8_bytes(m.get("content", "")) for m in messages) + allowance
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(
                list(messages), tokenize=True, add_generation_prompt=True
            )
            return len(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        return sum(self.text(m.get("content", "")) for m in messages) + allowance

    def text(self, text: str) -> int:
        """The tokens of a reply's ``text`` (without a tokenizer: its UTF-8 bytes)."""
        if self.tokenizer is None:
            return utf8_bytes(text)
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", errors="replace"))


def usd(prompt_tokens: float, completion_tokens: float, prices: Sequence[float]) -> float:
    """Dollars for the tokens at ``prices`` = (USD per million prompt tokens, per million
    completion tokens)."""
    return (prompt_tokens * prices[0] + completion_tokens * prices[1]) / 1e6


@dataclass(frozen=True)
class RequestGroup:
    """One kind of request of a command (e.g. the warmup's player turns).

    ``calls``: an upper bound on the requests; ``prompt_chars``: their prompts' characters in all;
    ``max_tokens``: each request's completion bound; ``cached``: how many of ``calls`` are already
    in the cache (None: not known before calling); ``prices``: USD per million prompt and
    completion tokens ((0, 0): not set)."""

    name: str
    calls: int
    prompt_chars: int
    max_tokens: int
    cached: int | None = None
    prices: tuple[float, float] = (0.0, 0.0)

    @property
    def prompt_tokens(self) -> int:
        return tokens_from_chars(self.prompt_chars)

    @property
    def completion_tokens(self) -> int:
        return self.calls * self.max_tokens

    @property
    def usd(self) -> float:
        return usd(self.prompt_tokens, self.completion_tokens, self.prices)


def estimate_text(
    prefix: str, groups: Sequence[RequestGroup], cap: str = "", what: str = "API estimate"
) -> str:
    """The estimate's lines: the total, then one a group, then ``cap`` (the caps said)."""
    priced = any(any(g.prices) for g in groups)
    lines = []
    for g in groups:
        cached = "" if g.cached is None else f" ({g.cached} already cached)"
        money = f", <= ${g.usd:.4f}" if any(g.prices) else ""
        lines.append(
            f"{prefix}   {g.name}: <= {g.calls:,} calls{cached}, ~{g.prompt_tokens:,} prompt + "
            f"<= {g.completion_tokens:,} completion tokens{money}"
        )
    calls = sum(g.calls for g in groups)
    tokens = sum(g.prompt_tokens + g.completion_tokens for g in groups)
    money = f", <= ${sum(g.usd for g in groups):.4f}" if priced else " (no prices set: no USD)"
    head = f"{prefix} {what}: <= {calls:,} calls, ~{tokens:,} tokens{money}"
    tail = [f"{prefix}   cap: {cap}"] if cap else []
    return "\n".join([head, *lines, *tail])


def usage_text(prefix: str, usage: dict[str, dict[str, float]]) -> str:
    """One line of what a command's clients spent (``ClientStats.as_dict`` by client name)."""
    parts = [
        f"{name} {u['requests']:.0f} requests ({u['cache_hits']:.0f} answered from the cache), "
        f"{u['prompt_tokens']:.0f} + {u['completion_tokens']:.0f} tokens, ${u['cost_usd']:.4f}"
        for name, u in usage.items()
    ]
    return f"{prefix} API spent: " + "; ".join(parts)


class ApiCapSettings(Protocol):
    """A config section that caps a command's paid requests (``ApiBudget.for_section``)."""

    max_api_calls: int
    max_api_usd: float


def max_calls_field(clients: str) -> Any:
    """A config section's ``max_api_calls``: the cap on the paid requests of ``clients`` (in
    words, e.g. "player and annotator")."""
    return field(
        default=0,
        metadata={
            "help": "stop (exit 3) before the request that would pass this many paid requests "
            f"({clients} together, retries included, cached answers free); 0: no cap",
            "ge": 0,
        },
    )


def max_usd_field() -> Any:
    """A config section's ``max_api_usd``: the cap on its paid requests' dollars (its prices:
    ``prices_field``, checked by ``check_priced``)."""
    return field(
        default=0.0,
        metadata={
            "help": "stop (exit 3) before the request that could pass this many dollars "
            "(needs the prices below); 0: no cap",
            "ge": 0,
        },
    )


def prices_field(whose: str) -> Any:
    """A config section's ``<client>_usd_per_mtok``: ``whose`` (e.g. "the player's") USD per
    million prompt and completion tokens, (0, 0) unset."""
    return field(
        default=(0.0, 0.0),
        metadata={"help": f"{whose} USD per million (prompt, completion) tokens", "ge": 0},
    )


def check_priced(section: str, max_usd: float, prices: Mapping[str, Sequence[float]]) -> None:
    """A dollar cap needs a price: a ``ValueError`` naming ``section``'s price keys when
    ``max_usd`` is set and every price in ``prices`` (key -> (prompt, completion) USD) is 0."""
    if max_usd and not any(any(p) for p in prices.values()):
        keys = " and ".join(f"{section}.{key}" for key in prices)
        raise ValueError(f"{section}.max_api_usd={max_usd:g} needs prices: set {keys}")


class BudgetExceeded(RunStopped):
    """The next request would pass the command's API cap; nothing more is sent."""


class ApiBudget:
    """A cap on the requests and dollars of one command's clients (0: no cap), thread-safe.

    ``calls_key`` / ``usd_key`` name the config keys in the stop message; ``hint`` ends it (where
    the answers so far are kept, how to continue)."""

    def __init__(
        self,
        max_calls: int = 0,
        max_usd: float = 0.0,
        calls_key: str = "max_api_calls",
        usd_key: str = "max_api_usd",
        hint: str = "",
    ):
        if max_calls < 0 or max_usd < 0:
            raise ValueError(f"API caps must be >= 0 (0: none), got {max_calls}, {max_usd}")
        self.max_calls, self.max_usd = int(max_calls), float(max_usd)
        self.calls_key, self.usd_key, self.hint = calls_key, usd_key, hint
        self.sent = 0  # requests sent (retries included)
        self.spent_usd = 0.0  # of the answered ones
        self.reserved_usd = 0.0  # bounds of the requests in flight
        self.stopped: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_section(cls, section: str, settings: ApiCapSettings, cache: Path) -> ApiBudget:
        """The cap of a command whose config section ``section`` (``settings``) holds
        ``max_api_calls`` and ``max_api_usd`` (``max_calls_field``, ``max_usd_field``), its
        answers cached under ``cache`` (said in the stop message)."""
        return cls(
            settings.max_api_calls,
            settings.max_api_usd,
            f"{section}.max_api_calls",
            f"{section}.max_api_usd",
            f"the answers so far are cached under {cache}: rerun with a higher cap to continue "
            "without paying for them again",
        )

    def describe(self) -> str:
        """The caps in one line, as the config keys that set them."""
        caps = [f"{self.calls_key}={self.max_calls}"] if self.max_calls else []
        caps += [f"{self.usd_key}={self.max_usd:g}"] if self.max_usd else []
        return ", ".join(caps) or f"none ({self.calls_key}, {self.usd_key})"

    @property
    def capped(self) -> bool:
        return bool(self.max_calls or self.max_usd)

    def reserve(self, cost_bound: float = 0.0) -> None:
        """Count one request about to be sent, or raise ``BudgetExceeded`` (and refuse every
        later one) when it would pass a cap. ``cost_bound``: the request's dollars at most (its
        prompt's bound and ``max_tokens``: ``LLMClient`` reserves with ``TokenCounter``)."""
        with self._lock:
            if self.stopped is None:
                if self.max_calls and self.sent + 1 > self.max_calls:
                    self.stopped = (
                        f"API cap {self.calls_key}={self.max_calls} reached: {self.sent} requests "
                        f"sent (${self.spent_usd:.4f})"
                    )
                elif self.max_usd and (
                    self.spent_usd + self.reserved_usd + cost_bound > self.max_usd
                ):
                    self.stopped = (
                        f"API cap {self.usd_key}={self.max_usd:g} reached: ${self.spent_usd:.4f} "
                        f"spent in {self.sent} requests, the next could cost ${cost_bound:.4f}"
                    )
            if self.stopped is not None:
                raise BudgetExceeded(self.stopped + (f"; {self.hint}" if self.hint else ""))
            self.sent += 1
            self.reserved_usd += cost_bound

    def settle(self, cost_bound: float, cost: float) -> None:
        """A reserved request is over: its bound released, its cost spent (0 when it was refused
        before the server generated; its bound when it may have generated: a timeout)."""
        with self._lock:
            self.reserved_usd = max(0.0, self.reserved_usd - cost_bound)
            self.spent_usd += cost


def on_rank_zero(fn: Callable[[], T], heartbeat_s: float = 60.0) -> T:
    """``fn()`` run by rank 0 alone, its result on every rank (a launcher's ranks would otherwise
    each send, and pay for, the same requests). Rank 0 runs ``fn`` in a thread and broadcasts a
    heartbeat every ``heartbeat_s`` seconds until it ends, so the other ranks wait in short
    collectives, never one as long as ``fn`` (NCCL's timeout). A ``RunStopped`` from ``fn`` is
    raised on every rank with its message; another exception on rank 0 as it is, on the others
    as a ``RuntimeError`` naming it. In one process: ``fn()``."""
    from common.train.distributed import broadcast_object, current_rank, is_multi_rank

    if not is_multi_rank():
        return fn()
    if current_rank() == 0:
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["out"] = ("ok", fn())
            except RunStopped as e:
                box["out"] = ("stopped", str(e))
            except BaseException as e:  # noqa: BLE001 - told to every rank, re-raised below
                box["out"], box["error"] = ("failed", f"{type(e).__name__}: {e}"), e

        thread = threading.Thread(target=work, name="rank0-calls", daemon=True)
        thread.start()
        while True:
            thread.join(heartbeat_s)
            if thread.is_alive():
                broadcast_object(("running", None))
                continue
            status, value = broadcast_object(box["out"])
            break
        if "error" in box:
            raise box["error"]
    else:
        while True:
            status, value = broadcast_object(None)
            if status != "running":
                break
    if status == "stopped":
        raise RunStopped(value)
    if status == "failed":
        raise RuntimeError(f"rank 0 failed in the calls made for every rank: {value}")
    return value
