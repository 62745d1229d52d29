"""The generation-engine interface shared by the vLLM and HF engines.

Prompts go in as token ids and completions come out as token ids: nothing is decoded and
re-tokenized on the way to the trainer. ``text`` is only for parsing actions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: the agent's config loads without torch
    import torch


@dataclass
class SamplingConfig:
    """Sampling parameters for one ``generate`` call."""

    n: int = field(default=1, metadata={"help": "completions per prompt"})
    temperature: float = field(default=1.0, metadata={"help": "0 = greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    top_k: int = field(default=0, metadata={"help": "0 = no top-k cut"})
    max_tokens: int = field(default=128, metadata={"help": "new tokens per completion"})
    stop: list[str] = field(default_factory=list, metadata={"help": "stop strings, kept in output"})
    stop_token_ids: list[int] = field(default_factory=list, metadata={"help": "extra stop ids"})
    seed: int | None = field(default=None, metadata={"help": "per-call seed (GPU vLLM and HF)"})
    prompt_seeds: list[int] | None = field(
        default=None,
        metadata={
            "help": "one seed per prompt, for GPU vLLM (sample k of prompt i: prompt_seeds[i] + "
            "k); instead of seed there, where every prompt's sample k would share seed + k"
        },
    )


def request_seeds(params: SamplingConfig, n_prompts: int) -> list[int | None]:
    """The seed each prompt's request carries: ``params.prompt_seeds`` when given (one per prompt),
    else ``params.seed`` for every prompt."""
    if params.prompt_seeds is None:
        return [params.seed] * n_prompts
    if len(params.prompt_seeds) != n_prompts:
        raise ValueError(
            f"SamplingConfig.prompt_seeds has {len(params.prompt_seeds)} seeds for {n_prompts} "
            "prompts"
        )
    return list(params.prompt_seeds)


def mix_seed(*parts: int) -> int:
    """A seed in [0, 2**63) from integer parts (blake2b of their decimal text): parts that differ
    give unrelated seeds, so one run's (step, rank, trajectory, turn) never share one."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class Completion:
    """One sampled continuation: ids, the sampling logprob of each id, and its decoded text."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (stop string, stop id or eos) or "length"
    # HFEngine(keep_kv=True) only: the generation's KV cache and logits for this row
    kv: GeneratedKV | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, eq=False)
class GeneratedKV:
    """What one ``model.generate`` batch computed for one of its rows, for reuse by a scorer.

    ``layers``: the batch's (key, value) per layer, [b, heads, W + T - 1, head_dim], W the
    left-padded prompt width, T the generated length; ``prompt_mask``: this row's [W] mask;
    ``logits``: the batch's raw logits [b, T, vocab], step t the distribution of token t.
    Token t of the response sits in column W + t.
    """

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    row: int
    prompt_mask: torch.Tensor
    logits: torch.Tensor

    def usable_for(self, n_response_tokens: int) -> bool:
        """Whether the first ``n`` response tokens' cache and the next step's logits exist."""
        return 0 <= n_response_tokens < self.logits.shape[1]


class GenerationEngine(Protocol):
    """What the rollout code needs from an inference engine."""

    def generate(
        self, prompts: list[list[int]], params: SamplingConfig, adapter: str | None = None
    ) -> list[list[Completion]]:
        """``params.n`` completions for each token-id prompt, in prompt order."""
        ...

    def score(
        self, prefixes: list[list[int]], continuations: list[list[int]], adapter: str | None = None
    ) -> list[list[float]]:
        """log pi(continuation token | prefix + earlier continuation tokens), per token."""
        ...

    def push_weights(self, named_weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF names) into the engine in place."""
        ...


def stop_length(
    token_ids: list[int], piece_of: Callable[[int], str], stop: list[str], stop_ids: set[int]
) -> tuple[int, bool]:
    """Length of the shortest prefix of ``token_ids`` that ends a turn, and whether it stopped.

    A turn ends at the first stop id or at the first token that completes a stop string; that
    token is kept. ``piece_of`` decodes one token (stop strings are matched on the running text).
    """
    text = ""
    longest = max((len(s) for s in stop), default=0)
    for i, tok in enumerate(token_ids):
        if tok in stop_ids:
            return i + 1, True
        if stop:
            text = (text + piece_of(tok))[-(longest + 64) :]
            if any(s in text for s in stop):
                return i + 1, True
    return len(token_ids), False
