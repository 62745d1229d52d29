"""The CER run's settings: one dataclass tree, every field with its help text.

Every path the run reads sits under ``assets``; ``check_assets`` fails before any expensive work
when one is missing, saying how to get it (``assets.how_to_get``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from common.model_id import model_reason
from common.rewards import REWARDS
from common.rewards import RewardConfig as CommonRewardConfig
from common.run_config import EvalAssetsConfig, RunLoopConfig
from common.run_config import LossConfig as GRPOLossConfig
from common.train.config import TrainConfig

REWARD_TYPES = ("exact", "rule", "cer", "rule+cer", "verifree")
# reward.fn's built-in names: every reward type, and common's search-agent rewards
BUILTIN_REWARDS = {
    **REWARDS,
    "exact": "cer.rewards.groups:EXACT",
    "rule": "cer.rewards.groups:RULE",
    "cer": "cer.rewards.groups:CER",
    "rule+cer": "cer.rewards.groups:RULE_CER",
    "verifree": "cer.rewards.groups:VERIFREE",
}


@dataclass
class AssetsConfig(EvalAssetsConfig):
    """Every model and data path of the run (local folders and files, hub ids, ``hf://`` data;
    the shared keys: ``common.run_config``)."""

    model: str = field(
        default="runs/cer/tiny/warmup/model",
        metadata={"help": "policy to train: HF folder or hub id (e.g. Qwen/Qwen3-4B-Base)"},
    )
    init_model: str = field(
        default="runs/cer/tiny/task/model",
        metadata={"help": "model the supervised warmup begins from ('' = no warmup)"},
    )
    warmup: str = field(
        default="runs/cer/tiny/task/warmup.jsonl",
        metadata={"help": "worked solutions for the warmup (problem, solution)"},
    )
    train: str = field(
        default="runs/cer/tiny/task/train.jsonl", metadata={"help": "training problems"}
    )
    train_format: Literal[
        "auto", "math", "answer", "webinstruct", "mmlu_pro", "supergpqa", "hotpotqa"
    ] = field(
        default="auto", metadata={"help": "cer.data format of the train file (auto: by its keys)"}
    )
    train_filter: Literal["none", "webinstruct_paper"] = field(
        default="none",
        metadata={"help": "webinstruct_paper: category != Mathematics, difficulty == University"},
    )
    dev: str = field(
        default="runs/cer/tiny/task/dev.jsonl", metadata={"help": "dev problems (periodic eval)"}
    )
    eval: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "benchmark name -> file (or hf://id[:config]@split) for `cer eval`"},
    )
    how_to_get: str = field(
        default="python -m cer build-tiny --out runs/cer/tiny/task",
        metadata={"help": "how to obtain the assets (shown when one is missing)"},
    )


@dataclass
class RewardConfig(CommonRewardConfig):
    """Which reward trains the policy, and how CER is estimated (the shared keys:
    ``common.rewards.RewardConfig``; an empty ``fn`` is ``type``'s reward)."""

    REWARDS: ClassVar[Mapping[str, str]] = BUILTIN_REWARDS

    type: Literal["exact", "rule", "cer", "rule+cer", "verifree"] = field(
        default="cer",
        metadata={
            "help": "exact | rule (math-verify / letter) | cer | rule+cer | verifree (VeriFree: "
            "pi(a* | own solution), 0 without an answer; trained with its likelihood term, "
            "see verifree_likelihood)"
        },
    )
    fn: str = field(
        default="",
        metadata={
            "help": "the reward that trains, instead of type's: a type, exact_match | f1 "
            "(common's, SQuAD-normalised, over answer_forms) or package.module:Name "
            "(common.rewards; ctx.scoring holds CER's scorer, a "
            "cer.rewards.groups.CERScoring); empty = type"
        },
    )
    fn_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for a reward fn that is a class, e.g. reward.fn="
            "common.reward_adapters:TRLReward reward.fn_args.function=trl.rewards:accuracy_reward"
        },
    )
    m: int | None = field(
        default=None,
        metadata={"help": "solutions CER averages over (null = the whole group G)", "ge": 1},
    )
    frozen_scorer: bool = field(
        default=False,
        metadata={"help": "score with a frozen copy of the initial policy instead of the live one"},
    )
    scorer: Literal["prefix", "engine"] = field(
        default="prefix",
        metadata={
            "help": "prefix: hf_prefix_scorer on the training model (a group's prompt and each "
            "solution forwarded once) | engine: the rollout engine's score (vLLM prompt "
            "logprobs; vLLM skips its prefix cache for those, so every pair is a full prefill)"
        },
    )
    scorer_batch_size: int = field(
        default=64,
        metadata={"help": "rows (prompts, or solutions with their answers) a forward", "ge": 1},
    )
    advantage: Literal["rloo", "grpo"] = field(
        default="rloo",
        metadata={"help": "rloo: r - leave-one-out mean (no std); grpo: (r - mean) / std"},
    )

    verifree_likelihood: bool = field(
        default=True,
        metadata={
            "help": "verifree: train as published, the sample's answer replaced by the reference "
            "and the reference tokens trained with weight pi(a* | s) (cer/rewards/verifree.py); false: "
            "the scalar reward on the sampled response only (a simplification)"
        },
    )
    signal: bool = field(
        default=True,
        metadata={
            "help": "log signal/* each step (cer.rewards.diagnostics): every reward type on every group, "
            "pi(a*|s) after the solutions the oracle calls right and wrong, each type's AUC "
            "against the oracle within groups and mean |advantage|; an exact or rule run "
            "then scores its groups too (a forward of every solution), m < G every solution"
        },
    )
    m_selection: Literal["per_answer", "first"] = field(
        default="per_answer",
        metadata={
            "help": "with m < G, the m solutions CER averages an answer over: per_answer (the "
            "release: the first m that produced the answer, then the first others) | first "
            "(the group's first m, for every answer)"
        },
    )
    math_verifier: Literal["boxed", "last512"] = field(
        default="boxed",
        metadata={
            "help": "the rule on math rows (rule reward, every accuracy): boxed = math-verify on "
            "the boxed answer | last512 = the release's check, math-verify on the response's "
            "last 512 characters, no box needed"
        },
    )
    choice_verifier: Literal["letter", "strict"] = field(
        default="letter",
        metadata={
            "help": "the rule on multiple-choice rows: letter = the letter the boxed answer names "
            "(B, (B), B., \\text{B}) | strict = the release's check, the boxed answer is the "
            "letter itself"
        },
    )

    def reward_name(self) -> str:
        """What names the outcome reward: ``fn``, else ``type``."""
        return self.fn or self.type


@dataclass
class LossConfig(GRPOLossConfig):
    """The clipped policy loss (CER: summed over tokens, averaged over sequences)."""

    aggregation: Literal[
        "seq_mean_token_sum", "seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"
    ] = field(
        default="seq_mean_token_sum",
        metadata={
            "help": "seq_mean_token_sum | seq_mean_token_mean | token_mean | "
            "seq_mean_token_sum_norm"
        },
    )


@dataclass
class SamplingSettings:
    """Rollout sampling during training."""

    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "ge": 0})
    top_p: float = field(default=1.0, metadata={"help": "nucleus mass", "gt": 0, "le": 1})
    top_k: int = field(default=0, metadata={"help": "0 = no top-k cut", "ge": 0})


@dataclass
class EvalConfig:
    """`cer eval` and the periodic dev evaluation."""

    k: int = field(default=16, metadata={"help": "samples per problem for avg@k", "ge": 1})
    temperature: float = field(
        default=0.6, metadata={"help": "avg@k sampling temperature", "ge": 0}
    )
    top_p: float = field(default=0.95, metadata={"help": "avg@k nucleus mass", "gt": 0, "le": 1})
    top_k: int = field(default=20, metadata={"help": "avg@k top-k", "ge": 0})
    greedy: bool = field(default=True, metadata={"help": "also evaluate one greedy sample"})
    max_tokens: int = field(
        default=8192, metadata={"help": "response tokens at evaluation", "ge": 1}
    )
    max_examples: int = field(default=0, metadata={"help": "per benchmark (0 = all)", "ge": 0})
    out: str = field(default="", metadata={"help": "output folder (default <run_dir>/eval)"})
    k_by_benchmark: dict[str, int] = field(
        default_factory=dict,
        metadata={
            "help": "benchmark name -> samples per problem instead of k (the paper: one sample "
            "on mmlu_pro and supergpqa)",
            "ge": 1,
        },
    )


@dataclass
class CERWarmupConfig:
    """CER's supervised warmup on worked solutions (tiny task; the paper starts from a base model)."""

    steps: int = field(default=400, metadata={"help": "optimizer steps", "ge": 1})
    batch_size: int = field(default=16, metadata={"help": "solutions per optimizer step", "ge": 1})
    context_weight: float = field(
        default=0.0,
        metadata={
            "help": "weight of a language-modelling loss on the prompt tokens (question and "
            "context), added to the solution-token NLL; 0: solution tokens only",
            "ge": 0,
        },
    )
    out: str = field(
        default="runs/cer/tiny/warmup", metadata={"help": "output folder (model in <out>/model)"}
    )
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(lr=3e-3, warmup_steps=20, scheduler="cosine")
    )


@dataclass
class CERConfig(RunLoopConfig):
    """A CER (or baseline reward) GRPO-family run on single-turn math / free-form questions (the
    loop's fields: ``RunLoopConfig``)."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by train_cer and run_warmup; refused in configs
        "train.grad_accum": "prompts_per_step * group_size / ranks / loss.micro_batch_size",
        "train.total_steps": "steps",
        "train.seed": "seed",
        "warmup.train.total_steps": "warmup.steps",
        "warmup.train.seed": "seed",
    }

    RENAMED: ClassVar[dict[str, str]] = {  # docs/configuration.md
        "assets.benchmarks": "assets.eval",
        "advantage": "reward.advantage",
    }

    run_dir: str = field(default="runs/cer/tiny/cer", metadata={"help": "output folder"})
    steps: int = field(default=30, metadata={"help": "RL steps (one optimizer step each)", "ge": 1})
    eval_questions: int = field(
        default=200, metadata={"help": "dev problems in the greedy dev evaluation", "ge": 1}
    )
    samples_per_step: int = field(
        default=1,
        metadata={"help": "groups written to samples/ with every reward type's value", "ge": 0},
    )
    torch_threads: int = field(
        default=0, metadata={"help": "torch CPU threads (0 = torch's default)", "ge": 0}
    )
    prompts_per_step: int = field(
        default=8,
        metadata={
            "help": "B: prompts per step over all ranks (global, as verl's "
            "data.train_batch_size; each of R ranks takes B / R)",
            "ge": 1,
        },
    )
    group_size: int = field(default=8, metadata={"help": "G: samples per prompt", "ge": 1})
    max_prompt_tokens: int = field(
        default=2048, metadata={"help": "longer prompts are left out (counted and logged)", "ge": 1}
    )
    max_response_tokens: int = field(
        default=4096, metadata={"help": "sampled tokens per answer", "ge": 1}
    )
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    loss: LossConfig = field(default_factory=LossConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    warmup: CERWarmupConfig = field(default_factory=CERWarmupConfig)

    def __post_init__(self) -> None:
        if self.reward.m is not None and self.reward.m > self.group_size:
            raise ValueError(
                f"reward.m={self.reward.m} exceeds group_size={self.group_size}: CER averages "
                "over at most the group's G solutions"
            )


class MissingAssetError(FileNotFoundError):
    """A model or data file the run needs is not there."""


def check_assets(assets: AssetsConfig, needed: list[str]) -> None:
    """Raise ``MissingAssetError`` naming every missing asset of ``needed`` (field names of
    ``AssetsConfig``; ``eval`` checks every benchmark) and how to get them. ``hf://`` data is
    checked when loaded."""
    missing = []
    for name in needed:
        if name in ("model", "init_model"):
            path = getattr(assets, name)
            reason = model_reason(path) if path else "is empty"
            if reason:  # a local folder, a cached hub id, or (online) one the hub has
                missing.append(f"assets.{name} = {path!r} ({reason})")
            continue
        paths = assets.eval if name == "eval" else {name: getattr(assets, name)}
        for key, path in paths.items():
            if not path.startswith("hf://") and not Path(path).is_file():
                where = f"assets.eval.{key}" if name == "eval" else f"assets.{name}"
                missing.append(f"{where} = {path!r} (no such file)")
    if missing:
        raise MissingAssetError(
            "missing asset(s):\n  "
            + "\n  ".join(missing)
            + f"\nHow to get them: {assets.how_to_get}\n"
            "(or point the assets.* keys at your copies, e.g. assets.model=/path/to/model)"
        )
