"""ARCO's run config: assets, environment, the shared backbone's adapters, the rubric, warmup and
co-evolution RL (docs/arco_internals.md, "Config keys and the run folder"). Every number of a
paper setting lives in ``arco/configs/*.yaml``.

Every external input (base model, QA files, corpus or retrieval server, teacher endpoints) sits in
``assets``; ``check_assets`` fails on a missing one before any model loads, saying how to get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from arco.environment import EnvironmentConfig
from arco.rubric_prompt import (
    DEFAULT_TASK,
    PREFIX_MODES,
    REQUEST_TEMPLATE,
    RUBRIC_MODES,
    SYSTEM_TEMPLATE,
    read_criteria_file,
)
from common.api_budget import check_priced, max_calls_field, max_usd_field, prices_field
from common.data import QAExample, check_where, load_qa_where, question_char_limit
from common.model_id import model_problem
from common.rewards import REWARDS, OutcomeReward, StepScorerConfig, load_part
from common.rollout.agent import AgentConfig
from common.run_config import EvalAssetsConfig, RunLoopConfig, SearchAssetsConfig

METHODS = ("arco", "outcome_only", "prm")
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# the ARCO release's HotpotQA warmup trajectories (its file name: GPT-4o-mini playing at
# temperature 1.0, GPT-5.4 annotating K = 3 criteria), at the commit the paper configs' HotpotQA
# splits come from
RELEASE_WARMUP_URL = (
    "https://raw.githubusercontent.com/zihangtian/ARCO/5974454e522e8997b92bb9c4e5a656ff23894e72/"
    "data/hotpotqa/output/warmup_train_api-gpt-4o-mini_rubric-gpt-5.4-ca_k3_temp1.0_strict_"
    "20260423_210457.jsonl"
)

HOW_TO_GET = {
    "model": "the tiny warmup: `make warmup` (tiny world + supervised agent); a paper "
    "backbone: a hub id such as Qwen/Qwen3-4B-Instruct-2507, downloaded first "
    "(`make data METHOD=arco SCALE=qwen3-4b DATA=hotpotqa` fetches it with the data, or "
    "`hf download Qwen/Qwen3-4B-Instruct-2507`; meta-llama/Llama-3.2-3B-Instruct is gated: "
    "accept its licence on its hub page, then `hf auth login`)",
    "qa": "the tiny world: `python -m common.tinyworld build --out runs/tinyworld/seed0`; "
    "the paper's data: `make data METHOD=arco SCALE=qwen3-4b|llama3.2-3b "
    "DATA=hotpotqa|2wiki|musique` (or `python -m experiments.prepare_data --config <this "
    "config>`) fetches the files the config names; by hand: HotpotQA distractor JSON: "
    "hotpot_train_v1.1.json / hotpot_dev_distractor_v1.json from the HotpotQA site (or the hub "
    "dataset hotpotqa/hotpot_qa, config distractor); 2WikiMultiHopQA and MuSiQue: their release "
    "files (dev.json, musique_ans_v1.0_dev.jsonl)",
    "corpus": "a corpus jsonl or index folder (`python -m common.retrieval index ...`), or "
    "assets.retrieval_url pointing at a Search-R1 retrieval server",
    "warmup": "run `python -m arco warmup --config <same config>` first (it writes warmup_dir; "
    "a paper config: `make warmup-arco SCALE=... DATA=... GPUS=8`)",
    "teacher": "an OpenAI-compatible endpoint (vLLM server, OpenAI): set "
    "assets.teacher_endpoint / teacher_model (and annotator_*) and the key's environment variable",
}


@dataclass
class AssetsConfig(SearchAssetsConfig, EvalAssetsConfig):
    """Every external input of a run, in one place (the shared keys: ``common.run_config``;
    ``corpus`` and ``retrieval_url`` are the open setting's)."""

    model: str = field(
        default="runs/warmup/tiny/model", metadata={"help": "backbone: HF folder or hub id"}
    )
    teacher_endpoint: str = field(
        default="", metadata={"help": "warmup (llm teacher): base URL of the policy-playing LLM"}
    )
    teacher_model: str = field(default="", metadata={"help": "its model name (gpt-4o-mini)"})
    annotator_endpoint: str = field(
        default="", metadata={"help": "warmup (llm teacher): base URL of the hindsight annotator"}
    )
    annotator_model: str = field(default="", metadata={"help": "its model name"})
    api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "environment variable holding the API key"}
    )
    train_where: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={
            "help": "keep only training questions whose metadata[key] (as text) is one of the "
            "values, for every key, e.g. {hops: ['3']}; empty = all (warmup and RL)"
        },
    )
    dev_where: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={"help": "the same filter for the dev questions (RL's evaluations, diagnose)"},
    )
    eval_where: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={"help": "the same filter for every benchmark of `arco eval` (assets.eval)"},
    )

    def __post_init__(self) -> None:
        for name in ("train_where", "dev_where", "eval_where"):
            check_where(getattr(self, name), f"assets.{name}")

    def benchmarks(self, max_question_chars: int | None = None) -> dict[str, list[QAExample]]:
        """``arco eval``'s question sets: each of ``eval`` kept by ``eval_where``, or the
        dev questions (kept by ``dev_where``) when there are none. ``max_question_chars``:
        longer questions are counted skips (``common.data``)."""
        if not self.eval:
            return {"dev": self.questions("dev", max_question_chars)}
        return {
            name: load_qa_where(path, self.eval_where, "assets.eval_where", max_question_chars)
            for name, path in self.eval.items()
        }

    def questions(self, split: str, max_question_chars: int | None = None) -> list[QAExample]:
        """The ``train`` or ``dev`` questions, kept by ``assets.<split>_where``; longer
        questions than ``max_question_chars`` are counted skips (``common.data``)."""
        path = {"train": self.train, "dev": self.dev}[split]
        where = getattr(self, f"{split}_where")
        return load_qa_where(path, where, f"assets.{split}_where", max_question_chars)


@dataclass
class LoraSpec:
    """The LoRA adapters of π and μ (same settings for both)."""

    r: int = field(default=8, metadata={"help": "rank (release: 8 for the 4B model)", "ge": 1})
    lora_alpha: int = field(default=32, metadata={"help": "alpha (scale alpha / r)", "ge": 1})
    lora_dropout: float = field(
        default=0.05, metadata={"help": "dropout on the LoRA input", "ge": 0, "lt": 1}
    )
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "v_proj"],
        metadata={"help": "modules adapted (release: q_proj, v_proj)"},
    )

    def as_peft(self) -> dict:
        return {
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": list(self.target_modules),
        }


@dataclass
class RubricConfig:
    """μ's criteria: how many, from which prefix, how long."""

    k: int = field(default=3, metadata={"help": "criteria per step (K)", "ge": 1, "le": 8})
    prefix: Literal["before", "after", "none"] = field(
        default="before",
        metadata={
            "help": "state in the rubric prompt: before the action (paper), after it (release "
            "RL bug), none (w/o-Prefix ablation)"
        },
    )
    mode: Literal["adaptive", "fixed", "none"] = field(
        default="adaptive",
        metadata={
            "help": "adaptive: μ writes K criteria per step (ARCO); fixed: the K criteria of "
            "criteria_file for every step (w/o-Adaptive ablation); none: one score per step "
            "from the prompt alone, no criteria (w/o-Rubric ablation, the PRM baseline)"
        },
    )
    criteria_file: str = field(
        default="",
        metadata={"help": "mode=fixed: text file, one criterion a line (# comments), K lines"},
    )
    max_new_tokens: int = field(default=128, metadata={"help": "criteria tokens, greedy", "ge": 1})
    shared_prefix: bool = field(
        default=True,
        metadata={
            "help": "μ's training-model forwards (scoring, update, μ_ref) take a trajectory's "
            "rows as one trunk with each step's tail after its branch point (block-causal "
            "mask; same values); false: one row a step"
        },
    )
    max_obs_chars: int = field(
        default=0, metadata={"help": "observations cut to this many characters (0: whole)", "ge": 0}
    )
    task: str = field(default=DEFAULT_TASK, metadata={"help": "task text in μ's system prompt"})
    system: str = field(
        default=SYSTEM_TEMPLATE, metadata={"help": "μ's system prompt, with {task}"}
    )
    request: str = field(
        default=REQUEST_TEMPLATE,
        metadata={"help": "the request closing μ's user prompt, with {k} and {example}"},
    )
    request_in: Literal["user", "system"] = field(
        default="user",
        metadata={
            "help": "where the request goes: user (the spec's layout: after the action) or "
            "system (after the system text, the same in every prompt: vLLM's prefix cache and "
            "the shared-prefix trunk share it; fewer μ tokens, a different prompt)"
        },
    )

    def templates(self) -> dict[str, str]:
        return {
            "task": self.task,
            "system": self.system,
            "request": self.request,
            "request_in": self.request_in,
        }

    @property
    def head_k(self) -> int:
        """Scores per step from the head under this section alone: K, or one without a rubric
        (mode none). A run reads ``ArcoConfig.head_k``, which method=prm makes one."""
        return 1 if self.mode == "none" else self.k

    def __post_init__(self) -> None:
        if self.mode not in RUBRIC_MODES:
            raise ValueError(f"rubric.mode={self.mode!r}; choose one of {RUBRIC_MODES}")
        if self.mode == "fixed" and not self.criteria_file:
            raise ValueError("rubric.mode=fixed needs rubric.criteria_file (one criterion a line)")
        if self.prefix not in PREFIX_MODES:
            raise ValueError(f"rubric.prefix={self.prefix!r}; choose one of {PREFIX_MODES}")
        if not 1 <= self.k <= 8:
            raise ValueError(f"rubric.k={self.k}; must be in 1..8")


@dataclass
class ArcoWarmupConfig:
    """ARCO's warmup: teacher trajectories, hindsight annotation, projection, π and μ SFT."""

    teacher: Literal["oracle", "llm", "file"] = field(
        default="oracle",
        metadata={
            "help": "oracle (tiny world: the world annotates) | llm (OpenAI-compatible) | file "
            "(the ARCO release's warmup data, warmup.release_file: no request)"
        },
    )
    release_file: str = field(
        default="",
        metadata={
            "help": "warmup.teacher=file: the release's warmup JSONL (data/hotpotqa/output/"
            "warmup_train_*.jsonl, written by its src/training/warmup_collect.py); its "
            "example_id are assets.train's HotpotQA _id; warmup.questions and warmup.samples "
            "cap what is imported (the file's first questions, each one's first records)"
        },
    )
    questions: int = field(default=1000, metadata={"help": "training questions played", "ge": 1})
    samples: int = field(default=3, metadata={"help": "teacher trajectories per question", "ge": 1})
    temperature: float = field(default=1.0, metadata={"help": "the playing teacher's", "ge": 0})
    select_questions: int = field(
        default=100,
        metadata={"help": "held-out training questions that choose π's epoch (never dev)", "ge": 1},
    )
    decomposition_tol: float = field(
        default=0.05,
        metadata={"help": "μ SFT keeps trajectories with |Σ_t mean_k − R| < tol", "gt": 0},
    )
    pi_epochs: int = field(
        default=6,
        metadata={"help": "π SFT epochs (0: no π SFT, π stays the backbone)", "ge": 0},
    )
    pi_lr: float = field(default=1e-5, metadata={"help": "π SFT learning rate", "gt": 0})
    pi_batch: int = field(
        default=64,
        metadata={
            "help": "π SFT examples per optimizer step, one example an agent step (the "
            "release's 64 = 2 a device x 32 accumulated)",
            "ge": 1,
        },
    )
    pi_loss_group: int = field(
        default=2,
        metadata={
            "help": "π SFT loss: the token mean over each group of this many examples of a "
            "step, averaged over the groups (the release's per-device batch, 2; 1: per "
            "example); divides pi_batch",
            "ge": 1,
        },
    )
    mu_epochs: int = field(default=10, metadata={"help": "μ SFT epochs", "ge": 1})
    mu_lr: float = field(default=5e-5, metadata={"help": "μ SFT adapter learning rate", "gt": 0})
    head_lr: float = field(default=1e-3, metadata={"help": "μ SFT head learning rate", "gt": 0})
    mu_batch: int = field(
        default=32, metadata={"help": "μ SFT steps (rubric prompts) per step", "ge": 1}
    )
    micro_batch_size: int = field(
        default=8,
        metadata={
            "help": "π and μ SFT examples per forward and backward; an optimizer step still "
            "takes pi_batch (mu_batch) examples, accumulated with the whole batch's loss "
            "normalisation",
            "ge": 1,
        },
    )
    check_items: int = field(
        default=64,
        metadata={"help": "after μ SFT, SFT steps μ writes criteria for (validity check)", "ge": 0},
    )
    score_weight: float = field(default=10.0, metadata={"help": "weight of the score MSE", "ge": 0})
    warmup_ratio: float = field(
        default=0.03, metadata={"help": "share of steps warming up", "ge": 0, "lt": 1}
    )
    weight_decay: float = field(default=0.01, metadata={"help": "AdamW weight decay", "ge": 0})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clip", "ge": 0})
    policy_from: str = field(
        default="",
        metadata={
            "help": "take π from this earlier warmup's folder instead of π SFT (μ is still "
            "trained here): every arm of a comparison starts from one π"
        },
    )
    teacher_concurrency: int = field(
        default=16, metadata={"help": "LLM requests in flight", "ge": 1}
    )
    teacher_timeout_s: float = field(default=60.0, metadata={"help": "per request", "gt": 0})
    teacher_backoff_s: float = field(
        default=1.0,
        metadata={"help": "seconds before a failed request's first retry (doubling)", "ge": 0},
    )
    api_cache_dir: str = field(
        default="runs/cache/llm",
        metadata={
            "help": "the LLM teacher's answers, one file per request keyed by its content "
            "(player/, annotator/), shared by every warmup: a rerun or another backbone on the "
            "same data pays once; '': <warmup_dir>/teacher_cache (or policy_from's), as before"
        },
    )
    max_api_calls: int = max_calls_field("player and annotator")
    max_api_usd: float = max_usd_field()
    player_usd_per_mtok: tuple[float, float] = prices_field("the player's")
    annotator_usd_per_mtok: tuple[float, float] = prices_field("the annotator's")

    def __post_init__(self) -> None:
        if self.teacher not in ("oracle", "llm", "file"):
            raise ValueError(f"warmup.teacher={self.teacher!r}; choose oracle, llm or file")
        self.player_usd_per_mtok = tuple(self.player_usd_per_mtok)
        self.annotator_usd_per_mtok = tuple(self.annotator_usd_per_mtok)
        prices = {
            "player_usd_per_mtok": self.player_usd_per_mtok,
            "annotator_usd_per_mtok": self.annotator_usd_per_mtok,
        }
        check_priced("warmup", self.max_api_usd, prices)
        for name in (
            "questions",
            "samples",
            "mu_epochs",
            "pi_batch",
            "mu_batch",
            "micro_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"warmup.{name}={getattr(self, name)}; must be >= 1")
        if self.pi_epochs < 0:
            raise ValueError(f"warmup.pi_epochs={self.pi_epochs}; must be >= 0 (0: no π SFT)")
        if self.pi_loss_group < 1 or self.pi_batch % self.pi_loss_group:
            raise ValueError(
                f"warmup.pi_loss_group={self.pi_loss_group} must be >= 1 and divide "
                f"warmup.pi_batch={self.pi_batch}"
            )


@dataclass
class ArcoRewardConfig(StepScorerConfig):
    """The outcome reward R(τ) of a trajectory (``common.rewards``): what the sparse phase's group
    advantages are of and what μ's step scores are trained to add up to (the decomposition
    loss; its class weights split the batch at R > 0.5, so a reward in [0, 1] keeps their
    meaning). The default is the paper's, exact match. And what scores the dense phase's steps
    (``StepScorerConfig``): μ (``rubric``, ARCO) or a step scorer in its place."""

    OWN: ClassVar[str] = "rubric"
    OWN_MEANS: ClassVar[str] = "rubric (μ's own)"

    step_scorer: str = field(
        default="rubric",
        metadata={
            "help": "what scores the dense phase's steps: rubric (μ, ARCO) | package.module:Name, "
            "a step scorer (common.rewards.StepScorer, given ctx.examples by question "
            "id), e.g. experiments.step_scorers:TeacherEvidenceSteps; μ is then not used in RL"
        },
    )

    fn: str = field(
        default="exact_match",
        metadata={
            "help": "outcome reward: exact_match (the paper's EM) | f1 | package.module:Name (an "
            "OutcomeReward, or a TRL or verl reward function, wrapped in its adapter)"
        },
    )
    fn_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for a reward that is a class, or the adapter's for a TRL "
            "or verl function (docs/reward_adapters.md)"
        },
    )

    def __post_init__(self) -> None:
        if self.fn not in REWARDS or self.fn_args:  # resolved and checked before any model loads
            self.reward_fn()
        super().__post_init__()

    def reward_fn(self) -> OutcomeReward:
        return load_part(self.fn, "reward.fn", "reward", REWARDS, self.fn_args)


@dataclass
class RLConfig:
    """Co-evolution RL: a sparse phase, then a dense phase; π and μ updated on every batch."""

    sparse_steps: int = field(default=90, metadata={"help": "steps of the sparse phase", "ge": 0})
    dense_steps: int = field(default=150, metadata={"help": "steps of the dense phase", "ge": 0})
    sparse_questions: int = field(
        default=16,
        metadata={
            "help": "questions per sparse update over all ranks (global, as verl's "
            "data.train_batch_size; each of R ranks takes B / R)",
            "ge": 1,
        },
    )
    sparse_n: int = field(default=4, metadata={"help": "rollouts per question (sparse)", "ge": 1})
    dense_questions: int = field(
        default=64,
        metadata={
            "help": "questions per dense update over all ranks (global; 1 rollout each)",
            "ge": 1,
        },
    )
    c: float = field(default=0.5, metadata={"help": "dense advantage scale c", "ge": 0})
    pi_kl_coef: float = field(
        default=0.05, metadata={"help": "KL(π‖π_ref) weight, dense phase", "ge": 0}
    )
    mu_kl_coef: float = field(default=0.05, metadata={"help": "β: KL(μ‖μ_ref) weight", "ge": 0})
    kl_direction: Literal["forward", "reverse"] = field(
        default="forward",
        metadata={"help": "forward = KL(current‖ref) (paper); reverse = KL(ref‖current) (release)"},
    )
    invalid_bucket: bool = field(
        default=True,
        metadata={
            "help": "invalid steps get their own baseline bucket (false: release's terminal)"
        },
    )
    pi_lr_sparse: float = field(default=1e-5, metadata={"help": "π lr, sparse phase", "gt": 0})
    pi_lr_dense: float = field(default=3e-6, metadata={"help": "π lr, dense phase", "gt": 0})
    mu_lr: float = field(default=1e-5, metadata={"help": "μ adapter lr (0: frozen μ)", "ge": 0})
    head_lr: float = field(
        default=5e-4, metadata={"help": "μ head lr (0 with mu_lr: frozen μ)", "ge": 0}
    )
    pi_dense_from: int = field(
        default=-1,
        metadata={
            "help": "π takes pi_lr_dense and the KL pi_kl_coef after this step (-1: after "
            "sparse_steps, ARCO's phase switch, which method=outcome_only keeps too though all "
            "its steps are sparse ones, unless outcome_schedule=sparse)",
            "ge": -1,
        },
    )
    outcome_schedule: Literal["arco", "sparse"] = field(
        default="arco",
        metadata={
            "help": "method=outcome_only: arco (π's lr and KL switch with ARCO's phases, so the "
            "baseline differs from ARCO in its advantages only) | sparse (pi_lr_sparse and no KL "
            "at every step)"
        },
    )
    freeze_rubric: bool = field(
        default=False,
        metadata={
            "help": "frozen μ (no co-evolution): μ's loss is not computed in RL, so its adapter "
            "and head get no gradient (μ is frozen anyway under method=prm or outcome_only and "
            "with an external reward.step_scorer)"
        },
    )
    micro_batch_size: int = field(
        default=16, metadata={"help": "trajectories per backward", "ge": 1}
    )
    score_batch_size: int = field(
        default=32,
        metadata={"help": "rubric sequences per no-grad scoring forward", "ge": 1},
    )
    mu_single_forward: bool = field(
        default=True,
        metadata={
            "help": "μ's rows forwarded once a batch, with gradient and without LoRA dropout: "
            "the update's forward gives the advantages' scores (detached); false: a no-grad "
            "scoring forward, then the update's forward again with dropout (the release's)"
        },
    )

    def __post_init__(self) -> None:
        if self.outcome_schedule not in ("arco", "sparse"):
            raise ValueError(
                f"rl.outcome_schedule={self.outcome_schedule!r}; choose arco or sparse"
            )
        if self.kl_direction not in ("forward", "reverse"):
            raise ValueError(f"rl.kl_direction={self.kl_direction!r}; choose forward or reverse")
        for name in ("sparse_questions", "sparse_n", "dense_questions", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"rl.{name}={getattr(self, name)}; must be >= 1")
        for name in ("sparse_steps", "dense_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"rl.{name}={getattr(self, name)}; must be >= 0")


@dataclass
class DiagnoseConfig:
    """``arco diagnose``: rollouts of the checkpoint's policy on dev questions, μ's rubrics."""

    questions: int = field(default=100, metadata={"help": "dev questions rolled out", "ge": 1})
    samples: int = field(
        default=4,
        metadata={
            "help": "rollouts per question; their actions at a step are the candidates",
            "ge": 1,
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "rollout temperature", "ge": 0})
    max_candidates: int = field(
        default=4, metadata={"help": "candidate actions per step, the real one included", "ge": 2}
    )
    out: str = field(
        default="", metadata={"help": "output folder (default: <checkpoint>/diagnose)"}
    )

    def __post_init__(self) -> None:
        for name in ("questions", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"diagnose.{name}={getattr(self, name)}; must be >= 1")
        if self.max_candidates < 2:
            raise ValueError(f"diagnose.max_candidates={self.max_candidates}; must be >= 2")


@dataclass
class ArcoConfig(RunLoopConfig):
    """One ARCO run: warmup writes ``warmup_dir``; RL trains from it into ``run_dir`` (the
    loop's fields: ``RunLoopConfig``; ``steps`` is the phases' sum).

    ``train.weight_decay``, ``train.max_grad_norm`` and ``train.scheduler`` are RL's; the warmup
    takes ``warmup.weight_decay``, ``warmup.max_grad_norm`` and its own ``warmup.warmup_ratio``
    schedule."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by train_arco and run_warmup; refused in configs
        "train.lr": "rl.pi_lr_sparse, rl.mu_lr, rl.head_lr (arco train); warmup.pi_lr, "
        "warmup.mu_lr, warmup.head_lr (arco warmup)",
        "train.grad_accum": "rl.dense_questions / ranks / rl.micro_batch_size, x2 with "
        "rl.mu_single_forward (arco train); 1 (arco warmup, by warmup.micro_batch_size)",
        "train.total_steps": "rl.sparse_steps + rl.dense_steps",
        "train.seed": "seed",
        "steps": "rl.sparse_steps + rl.dense_steps",
    }
    RENAMED: ClassVar[dict[str, str]] = {  # docs/configuration.md
        "assets.train_file": "assets.train",
        "assets.dev_file": "assets.dev",
        "assets.eval_files": "assets.eval",
        "rl.step_scorer": "reward.step_scorer",
        "rl.step_scorer_args": "reward.step_scorer_args",
    }

    run_dir: str = field(default="runs/arco/tiny", metadata={"help": "RL output folder"})
    eval_questions: int = field(default=200, metadata={"help": "dev questions evaluated", "ge": 1})
    save_every: int = field(  # the paper's 535 steps are a long run: a kill loses <= 25 of them
        default=25,
        metadata={"help": "checkpoint every k steps and at the last (0: the last only)", "ge": 0},
    )
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    warmup_dir: str = field(
        default="runs/arco/tiny/warmup", metadata={"help": "warmup output (adapters + head)"}
    )
    method: Literal["arco", "outcome_only", "prm"] = field(
        default="arco",
        metadata={
            "help": "arco; outcome_only (every RL step a GRPO step on EM, no μ: the Search-R1 "
            "baseline; rl.dense_steps are run as sparse steps after rl.sparse_steps, the same "
            "budget); prm (AgentPRM baseline: a scalar step score without criteria, trained in "
            "warmup, frozen in RL: rubric.mode is read as none, rl.freeze_rubric as true)"
        },
    )
    env: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    reward: ArcoRewardConfig = field(default_factory=ArcoRewardConfig)
    lora: LoraSpec = field(default_factory=LoraSpec)
    rubric: RubricConfig = field(default_factory=RubricConfig)
    warmup: ArcoWarmupConfig = field(default_factory=ArcoWarmupConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    diagnose: DiagnoseConfig = field(default_factory=DiagnoseConfig)

    def __post_init__(self) -> None:
        self.steps = self.rl.sparse_steps + self.rl.dense_steps  # DERIVED
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r}; choose one of {METHODS}")
        if self.method == "prm" and self.rubric.mode == "fixed":
            raise ValueError("method=prm scores steps without criteria; drop rubric.mode=fixed")
        if self.reward.external and self.method != "arco":
            raise ValueError(
                f"reward.step_scorer={self.reward.step_scorer!r} drives ARCO's dense phase in "
                f"μ's place; method={self.method} has none of its own to replace"
            )
        if self.eval_every < 0 or self.eval_questions < 1 or self.keep_checkpoints < 1:
            raise ValueError("eval_every must be >= 0, eval_questions and keep_checkpoints >= 1")
        if self.steps < 1:
            raise ValueError("rl.sparse_steps + rl.dense_steps must be >= 1")
        if self.train.zero_stage == 3:
            raise ValueError(
                "train.zero_stage=3: ARCO trains LoRA adapters and a small head on a frozen base; "
                "use ZeRO-2 (the default)"
            )

    # What the method makes of the sections' keys, read by warmup and RL; the sections keep what
    # was set (config.yaml records it as given).

    @property
    def rubric_mode(self) -> str:
        """μ's rubric in this run: ``rubric.mode``; none under method=prm (one score a step
        from the prompt alone)."""
        return "none" if self.method == "prm" else self.rubric.mode

    @property
    def head_k(self) -> int:
        """Scores per step from μ's head: ``rubric.k``, or one without a rubric."""
        return 1 if self.rubric_mode == "none" else self.rubric.k

    @property
    def uses_mu(self) -> bool:
        """Whether μ scores RL's steps: not under method=outcome_only, nor with an external
        ``reward.step_scorer`` in its place."""
        return self.method != "outcome_only" and not self.reward.external

    @property
    def mu_frozen(self) -> bool:
        """Whether μ gets no gradient in RL: ``rl.freeze_rubric``, method=prm (trained in
        warmup only), or μ not used in RL (``uses_mu``)."""
        return self.rl.freeze_rubric or self.method == "prm" or not self.uses_mu

    @property
    def sparse_steps(self) -> int:
        """Steps of the sparse phase: ``rl.sparse_steps``; every step under method=outcome_only
        (its ``rl.dense_steps`` run as sparse steps, the same budget)."""
        return self.steps if self.method == "outcome_only" else self.rl.sparse_steps

    @property
    def dense_steps(self) -> int:
        """Steps of the dense phase, after the sparse ones: ``rl.dense_steps``; none under
        method=outcome_only."""
        return self.steps - self.sparse_steps

    @property
    def pi_switch_step(self) -> int:
        """The last step with π's sparse-phase lr and no KL: ``rl.pi_dense_from``, by default
        (-1) ARCO's phase switch after ``rl.sparse_steps``, which method=outcome_only keeps
        unless ``rl.outcome_schedule=sparse`` (then never: the last step)."""
        if self.rl.pi_dense_from >= 0:
            return self.rl.pi_dense_from
        if self.method == "outcome_only" and self.rl.outcome_schedule == "sparse":
            return self.steps
        return self.rl.sparse_steps

    def question_chars(self) -> int:
        """The character bound of a question (``common.data.question_char_limit``) for the
        agent's prompt budget: ``agent.max_context`` and ``engine.max_model_len``, the smaller."""
        return question_char_limit(self.agent.max_context, self.engine.max_model_len)

    def check_assets(self, needs: tuple[str, ...]) -> None:
        """Fail before any model loads when a needed input is missing, saying how to get it."""
        a = self.assets
        problems = []
        problem = model_problem(a.model) if "model" in needs else None
        if problem:  # a local folder, a cached hub id, or (online) one the hub has
            problems.append(f"{problem}; {HOW_TO_GET['model']}")
        for key in [k for k in ("train", "dev") if k in needs]:
            path = getattr(a, key)
            if not path or not Path(path).exists():
                problems.append(f"assets.{key}: {path!r} not found; {HOW_TO_GET['qa']}")
        if "eval" in needs:
            if not a.eval:
                problems.append(f"assets.eval is empty; {HOW_TO_GET['qa']}")
            for name, path in a.eval.items():
                if not Path(path).exists():
                    problems.append(f"assets.eval.{name}: {path!r} not found")
        open_corpus = "retrieval" in needs and self.env.setting == "open" and not a.retrieval_url
        if open_corpus and not (a.corpus and Path(a.corpus).exists()):
            problems.append(f"assets.corpus: {a.corpus!r} not found; {HOW_TO_GET['corpus']}")
        crit = self.rubric.criteria_file
        if "model" in needs and self.rubric.mode == "fixed" and not Path(crit).is_file():
            problems.append(
                f"rubric.criteria_file: {crit!r} not found; write one criterion a line "
                "(arco/criteria/tiny.txt is the tiny world's)"
            )
        elif "model" in needs and self.rubric.mode == "fixed":
            try:  # its length and text now, not after the first rollouts
                read_criteria_file(crit, self.rubric.k)
            except (OSError, ValueError) as err:
                problems.append(f"rubric.criteria_file: {err}")
        src = self.warmup.policy_from
        if "teacher" in needs and src and not (Path(src) / "arco.json").is_file():
            problems.append(f"warmup.policy_from: {src!r} has no arco.json; {HOW_TO_GET['warmup']}")
        if "warmup" in needs and not (Path(self.warmup_dir) / "arco.json").is_file():
            problems.append(
                f"warmup_dir: {self.warmup_dir!r} has no arco.json; {HOW_TO_GET['warmup']}"
            )
        release = self.warmup.release_file
        if "teacher" in needs and self.warmup.teacher == "file" and not Path(release).is_file():
            problems.append(
                f"warmup.release_file: {release!r} not found; the ARCO release's warmup data "
                f"(HotpotQA, Qwen3-4B): `curl -L -o {release or 'FILE'} {RELEASE_WARMUP_URL}`, or "
                "a file in its format"
            )
        if "teacher" in needs and self.warmup.teacher == "llm":
            for key in (
                "teacher_endpoint",
                "teacher_model",
                "annotator_endpoint",
                "annotator_model",
            ):
                if not getattr(a, key):
                    problems.append(f"assets.{key} is empty; {HOW_TO_GET['teacher']}")
        if problems:
            if len(problems) == 1:  # one problem, one line
                raise FileNotFoundError(f"missing asset: {problems[0]}")
            raise FileNotFoundError("missing assets:\n  " + "\n  ".join(problems))
