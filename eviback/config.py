"""EviBack's run config: the GRPO loop's settings, the teacher backoff, evaluation and E2E-APE.

Every external input (model, QA files, corpus or index, retrieval server, teacher endpoint) sits
in ``assets``; ``check_assets`` fails on a missing one before any model is loaded, saying how to
get it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from common.api_budget import check_priced, max_calls_field, max_usd_field, prices_field
from common.data import check_where
from common.model_id import model_problem
from common.retrieval.index_folder import is_index_folder
from common.rewards import ESTIMATORS, REWARDS, OutcomeReward, RewardConfig, load_part
from common.run_config import EvalAssetsConfig, SearchAssetsConfig, SearchRunConfig

HOW_TO_GET = {
    "model": "build the tiny warmup with `python -m eviback warmup` (tiny) or SmolLM2's with "
    "`make warmup-smol` (SCALE=smol), or give a hub id "
    "such as Qwen/Qwen3-1.7B (a paper config's: `make data METHOD=eviback SCALE=1.7b` fetches "
    "it with the data; on an offline machine download it first: `hf download Qwen/Qwen3-1.7B`)",
    "qa": "the tiny world: `python -m common.tinyworld build --out runs/tinyworld/seed0`; "
    "SCALE=smol's HotpotQA questions: `make smol`; the "
    "paper's data: `make data METHOD=eviback SCALE=0.6b|1.7b|4b` (or `python -m "
    "experiments.prepare_data --config <this config>`) fetches the FlashRAG jsonl files the "
    "config names; by hand, from the hub dataset RUC-NLPIR/FlashRAG_datasets: `hf download "
    "--repo-type dataset RUC-NLPIR/FlashRAG_datasets --local-dir data/flashrag`",
    "corpus": "a corpus jsonl or an index folder (`python -m common.retrieval index ...`); "
    "Search-R1's E5 index of Wikipedia-2018: `make data-index INDEX=data/search_r1`, served by "
    "`make serve-retrieval INDEX=data/search_r1` at assets.retrieval_url",
}


@dataclass
class AssetsConfig(SearchAssetsConfig, EvalAssetsConfig):
    """Every external input of a run, in one place (the shared keys: ``common.run_config``)."""

    model: str = field(
        default="runs/warmup/tiny/model", metadata={"help": "actor: HF folder or hub id"}
    )
    train: str | dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "training questions: a QA file, or a mix, source name -> QA file (one file "
            "is the source 'train')"
        },
    )
    dev: str | dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "dev questions evaluated during training: a QA file, or source name -> QA "
            "file (one file is the source 'dev')"
        },
    )
    train_quotas: dict[str, int] = field(
        default_factory=dict,
        metadata={"help": "questions drawn per training source (seeded); empty = all", "ge": 1},
    )
    train_where: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={
            "help": "keep only training questions whose metadata[key] (as text) is one of the "
            "values, for every key (before quotas), e.g. {relation: [founder_birth_country]} or "
            "{type: [bridge], hops: ['3']}; empty = all"
        },
    )
    dev_where: dict[str, list[str]] = field(
        default_factory=dict,
        metadata={"help": "the same filter for the dev questions of training; empty = all"},
    )
    eval_quotas: dict[str, int] = field(
        default_factory=dict,
        metadata={"help": "questions drawn per benchmark (seeded); empty = all", "ge": 1},
    )
    selection: Literal["sha256", "random"] = field(
        default="sha256",
        metadata={
            "help": "how quotas pick questions: sha256 (the release: dedup, then SHA-256 rank "
            "with the selection seeds) | random (a draw seeded by `seed`)"
        },
    )
    train_selection_seed: int = field(
        default=26041755,
        metadata={"help": "sha256 selection seed of the training questions", "ge": 0},
    )
    eval_selection_seed: int = field(
        default=42, metadata={"help": "sha256 selection seed of the evaluation questions", "ge": 0}
    )
    release_names: dict[str, str] = field(
        default_factory=lambda: {"2wiki": "2wikimultihopqa"},
        metadata={"help": "source name -> the release's name, which enters the SHA-256 key"},
    )
    teacher_endpoint: str = field(
        default="", metadata={"help": "OpenAI-compatible base URL of the teacher (…/v1)"}
    )
    teacher_model: str = field(default="", metadata={"help": "the teacher's model name"})
    teacher_tokenizer: str = field(
        default="",
        metadata={
            "help": "the teacher's tokenizer (HF folder or hub id): the tokens of a reply sent "
            "without usage, and a request's bound under eviback ape's dollar cap; empty: UTF-8 "
            "bytes, an upper bound"
        },
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY",
        metadata={"help": "environment variable holding the teacher's and controller's API key"},
    )
    controller_endpoint: str = field(
        default="", metadata={"help": "E2E-APE controller LLM base URL (empty: grid candidates)"}
    )
    controller_model: str = field(default="", metadata={"help": "the controller's model name"})

    def __post_init__(self) -> None:
        for name in ("train_where", "dev_where"):
            check_where(getattr(self, name), f"assets.{name}")

    def files(self, split: Literal["train", "dev", "eval"]) -> dict[str, str]:
        """The QA files of ``split``, source name -> path (one file: the source ``split``)."""
        files = getattr(self, split)
        if isinstance(files, str):
            return {split: files} if files else {}
        return dict(files)


@dataclass
class TeacherConfig:
    """The evidence-constrained teacher backoff."""

    enabled: bool = field(
        default=True, metadata={"help": "false = the Search-R1 GRPO baseline (EM reward only)"}
    )
    backend: Literal["oracle", "llm"] = field(
        default="oracle",
        metadata={"help": "oracle (supporting documents known) | llm (assets.teacher_endpoint)"},
    )
    policy_file: str = field(
        default="",
        metadata={
            "help": "frozen E2E-APE policy; empty = the hand-written prompts (teacher.prompts)"
        },
    )
    prompts: Literal["gated", "single"] = field(
        default="gated",
        metadata={
            "help": "without policy_file: gated (the hand-written two-stage) | single (its "
            "stage-A prompt alone: the paper's hand-written single-prompt teacher)"
        },
    )
    beta: float = field(default=0.1, metadata={"help": "β: reward for supported evidence", "ge": 0})
    gamma: float = field(
        default=0.1, metadata={"help": "γ: weight of F1(teacher answer, gold)", "ge": 0}
    )
    lam: float = field(
        default=0.1, metadata={"help": "λ: advantage scale of all-zero groups", "ge": 0}
    )
    top_m: int = field(
        default=5, metadata={"help": "documents per round the oracle reads", "ge": 1}
    )
    max_concurrency: int = field(
        default=16, metadata={"help": "teacher requests in flight", "ge": 1}
    )
    overlap: bool = field(
        default=True,
        metadata={"help": "judge each all-zero group while the step's other rollouts go on"},
    )
    workers: int = field(
        default=2,
        metadata={"help": "groups judged at once in the background (with overlap)", "ge": 1},
    )
    timeout: float = field(
        default=60.0, metadata={"help": "seconds of each network wait of a request", "gt": 0}
    )
    deadline: float = field(
        default=300.0,
        metadata={"help": "seconds for a whole attempt, however slowly the server sends", "gt": 0},
    )
    retries: int = field(
        default=3,
        metadata={"help": "retries of a failed request (and of the endpoint's probe)", "ge": 0},
    )
    contract_retries: int = field(
        default=2,
        metadata={
            "help": "times a reply that breaks the verdict contract is asked again; then it is "
            "a missing verdict, as a failed request (never a zero)",
            "ge": 0,
        },
    )
    reply_models: list[str] = field(
        default_factory=list,
        metadata={
            "help": "model names a reply may carry besides assets.teacher_model, its provider "
            "prefix and dated snapshots (common.llm_client.model_matches); '*': any"
        },
    )
    backoff: float = field(
        default=1.0, metadata={"help": "seconds before the first retry (doubling)", "ge": 0}
    )
    max_failure_share: float = field(
        default=0.5,
        metadata={
            "help": "a step in which either stage's teacher requests (all ranks) give no usable "
            "verdict (failed, another model, broken contract) over this share stops the run, "
            "before its update, the last finished step saved; 1 = never",
            "ge": 0,
            "le": 1,
        },
    )
    temperature: float = field(
        default=0.0, metadata={"help": "teacher sampling temperature", "ge": 0}
    )
    top_p: float = field(default=1.0, metadata={"help": "teacher nucleus mass", "gt": 0, "le": 1})
    max_tokens: int = field(default=512, metadata={"help": "teacher completion tokens", "ge": 1})

    def __post_init__(self) -> None:
        if self.prompts == "single" and self.policy_file:
            raise ValueError(
                "teacher.prompts=single picks the hand-written prompt; teacher.policy_file "
                f"({self.policy_file}) already names the prompts: set one of them"
            )
        if self.prompts == "single" and self.enabled and self.backend == "oracle":
            raise ValueError(
                "teacher.prompts=single needs teacher.backend=llm: the evidence oracle reads no "
                "prompt, so a single-prompt run would be the gated run again"
            )


@dataclass
class EviBackRewardConfig(RewardConfig):
    """The reward and the estimator (``common.rewards``); the default is EviBack's own."""

    REWARDS = {**REWARDS, "eviback": "eviback.backoff:teacher_backoff_reward"}
    ESTIMATORS = {**ESTIMATORS, "backoff": "eviback.backoff:backoff_advantages"}

    fn: str = field(
        default="eviback",
        metadata={
            "help": "outcome reward: eviback (EM, the teacher backoff on all-zero groups) | "
            "exact_match | f1 | package.module:Name (given the verdicts in ctx.teacher, an "
            "eviback.backoff.TeacherVerdicts)"
        },
    )
    advantage: str = field(
        default="backoff",
        metadata={
            "help": "estimator: backoff (GRPO, λ on fallback groups after normalisation) | "
            "grpo | rloo | package.module:Name"
        },
    )
    base: str = field(
        default="",
        metadata={
            "help": "with fn=eviback: the reward of the groups that do not fall back to the "
            "teacher, in place of EM (exact_match | f1 | package.module:Name, e.g. "
            "cer.rewards.search_agent:AgentCER); empty: EM, the paper"
        },
    )

    def __post_init__(self) -> None:
        if self.base and self.fn != "eviback":
            raise ValueError(
                f"reward.base={self.base!r} is the base under EviBack's backoff: it needs "
                f"reward.fn=eviback (got {self.fn!r})"
            )
        if self.base == "eviback":
            raise ValueError("reward.base=eviback: the backoff cannot be its own base")
        super().__post_init__()
        self.base_fn()

    def base_fn(self) -> OutcomeReward | None:
        """The base reward under the backoff (``eviback.backoff.reward_of``); None: EM."""
        return load_part(self.base, "reward.base", "reward", self.REWARDS) if self.base else None


@dataclass
class EvalConfig:
    """`eviback eval`."""

    model: str = field(
        default="",
        metadata={"help": "model to evaluate; empty = run_dir's latest checkpoint, else assets"},
    )
    max_turns: int = field(
        default=0, metadata={"help": "agent turns at evaluation; 0 = agent.max_turns", "ge": 0}
    )
    bootstrap_resamples: int = field(
        default=10_000, metadata={"help": "paired bootstrap draws", "ge": 1}
    )
    confidence: float = field(
        default=0.95, metadata={"help": "bootstrap interval level", "gt": 0, "lt": 1}
    )
    compare_to: str = field(
        default="", metadata={"help": "another run's eval/per_question.jsonl to compare against"}
    )


@dataclass
class ApeConfig:
    """`eviback ape`: E2E-APE."""

    questions: int = field(default=40, metadata={"help": "training questions rolled out", "ge": 1})
    rollouts: int = field(default=2, metadata={"help": "actor rollouts per question", "ge": 1})
    holdout_fraction: float = field(
        default=0.3, metadata={"help": "questions held out", "gt": 0, "lt": 1}
    )
    unlabelled: Literal["skip", "llm"] = field(
        default="skip",
        metadata={
            "help": "questions without supporting facts (NQ, ...): skip (left out, counted) | "
            "llm (labelled by the controller LLM)"
        },
    )
    split: Literal["step", "question"] = field(
        default="step",
        metadata={
            "help": "holdout: step (stratified by search step, label quotas by largest "
            "remainder, as the release) | question (a seeded draw of questions)"
        },
    )
    candidates_a: int = field(default=4, metadata={"help": "stage-A prompts tried", "ge": 1})
    candidates_b: int = field(default=2, metadata={"help": "stage-B prompts tried", "ge": 1})
    written_a: int = field(
        default=2,
        metadata={
            "help": "stage-A instructions the controller writes (with a controller)",
            "ge": 0,
        },
    )
    written_b: int = field(
        default=1,
        metadata={
            "help": "stage-B instructions the controller writes (with a controller)",
            "ge": 0,
        },
    )
    gated_from_top: int = field(
        default=2, metadata={"help": "best stage-A prompts paired with stage B", "ge": 1}
    )
    repeats: int = field(default=2, metadata={"help": "runs per candidate (stability)", "ge": 1})
    objective_weights: tuple[float, float] = field(
        default=(0.5, 0.5), metadata={"help": "(w_I, w_coverage) of the objective", "ge": 0}
    )
    out: str = field(default="", metadata={"help": "output folder (default: <run_dir>/ape)"})
    max_api_calls: int = max_calls_field("labeller, controller and teacher")
    max_api_usd: float = max_usd_field()
    teacher_usd_per_mtok: tuple[float, float] = prices_field("the teacher's")
    controller_usd_per_mtok: tuple[float, float] = prices_field("the controller's (and labeller's)")

    def __post_init__(self) -> None:
        self.objective_weights = tuple(self.objective_weights)
        self.teacher_usd_per_mtok = tuple(self.teacher_usd_per_mtok)
        self.controller_usd_per_mtok = tuple(self.controller_usd_per_mtok)
        prices = {
            "teacher_usd_per_mtok": self.teacher_usd_per_mtok,
            "controller_usd_per_mtok": self.controller_usd_per_mtok,
        }
        check_priced("ape", self.max_api_usd, prices)
        if self.gated_from_top > self.candidates_a:
            raise ValueError(
                f"ape.gated_from_top={self.gated_from_top} exceeds ape.candidates_a="
                f"{self.candidates_a}: it pairs the best stage-A prompts with stage B"
            )


@dataclass
class EviBackConfig(SearchRunConfig):
    """An EviBack (or, teacher off, Search-R1 GRPO) run (the loop's fields: ``SearchRunConfig``)."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by train_eviback; refused in configs and overrides
        "train.grad_accum": "questions_per_step * n / ranks / loss.micro_batch_size",
        "train.total_steps": "steps",
        "train.seed": "seed",
    }
    RENAMED: ClassVar[dict[str, str]] = {  # docs/configuration.md
        "assets.train_files": "assets.train",
        "assets.dev_files": "assets.dev",
        "assets.eval_files": "assets.eval",
        "teacher.api_key_env": "assets.api_key_env",
    }

    run_dir: str = field(default="runs/eviback/tiny", metadata={"help": "output folder"})
    samples_per_step: int = field(
        default=8, metadata={"help": "rollouts written to samples/ each step", "ge": 0}
    )
    assets: AssetsConfig = field(default_factory=AssetsConfig)
    em_well_formed: bool = field(
        default=True,
        metadata={
            "help": "EM counts only from a well-formed trajectory (no invalid turn, ended with "
            "an answer), as the release; false = EM of whatever answer the rollout gave"
        },
    )
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    reward: EviBackRewardConfig = field(default_factory=EviBackRewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ape: ApeConfig = field(default_factory=ApeConfig)

    def check_assets(self, need: tuple[str, ...] = ("model", "train", "dev", "retrieval")) -> None:
        """Raise ``FileNotFoundError`` / ``ValueError`` for missing inputs, before heavy work: one
        missing input as its own message, several listed together with how to get each kind."""
        a = self.assets
        issues: list[tuple[type[Exception], str, str]] = []  # (error type, what, how to get it)

        def missing(what: str, how: str = "", kind: type[Exception] = FileNotFoundError) -> None:
            issues.append((kind, what, how))

        if "model" in need:
            try:
                _check_model(a.model)
            except FileNotFoundError as e:
                what, _, how = str(e).partition(". To get it: ")
                missing(what, how)
        for kind in ("train", "dev", "eval"):
            if kind not in need:
                continue
            files = a.files(kind)
            if not files:
                missing(f"assets.{kind} is empty: name at least one QA file", "", ValueError)
            one = isinstance(getattr(a, kind), str)  # one file: named assets.<kind> itself
            for name, path in files.items():
                key = f"assets.{kind}" if one else f"assets.{kind}.{name}"
                if not str(path).startswith("hf://") and not Path(path).is_file():
                    missing(f"{key}: {path} not found", HOW_TO_GET["qa"])
        if "retrieval" in need and not a.retrieval_url:
            if not a.corpus:
                missing(
                    "set assets.corpus (jsonl or index folder) or assets.retrieval_url",
                    "",
                    ValueError,
                )
            elif not (Path(a.corpus).is_file() or is_index_folder(a.corpus)):
                missing(
                    f"assets.corpus: {a.corpus} is neither a corpus file nor an index folder",
                    HOW_TO_GET["corpus"],
                )
        llm = self.teacher.enabled and self.teacher.backend == "llm"
        if "teacher" in need and llm and not (a.teacher_endpoint and a.teacher_model):
            missing(
                "teacher.backend=llm needs assets.teacher_endpoint and assets.teacher_model "
                "(e.g. a vLLM server: `make serve-teacher`, that is `vllm serve "
                "zai-org/GLM-4.7-Flash --port 8001 --reasoning-parser glm45` -> "
                "http://127.0.0.1:8001/v1)",
                "",
                ValueError,
            )
        policy = self.teacher.policy_file
        if "teacher" in need and policy and not Path(policy).is_file():
            missing(
                f"teacher.policy_file: {policy} not found; build it with "
                "`python -m eviback ape --config ...` or leave it empty"
            )
        _raise_missing(issues)


def _raise_missing(issues: list[tuple[type[Exception], str, str]]) -> None:
    """One issue as before (``what. To get it: how``); several as one error listing them all."""
    if not issues:
        return
    if len(issues) == 1:
        kind, what, how = issues[0]
        raise kind(f"{what}. To get it: {how}" if how else what)
    kind = FileNotFoundError if any(k is FileNotFoundError for k, _, _ in issues) else ValueError
    hows = list(dict.fromkeys(how for _, _, how in issues if how))
    raise kind(
        f"{len(issues)} inputs missing:\n"
        + "\n".join(f"  - {what}" for _, what, _ in issues)
        + ("\nTo get them:\n" + "\n".join(f"  - {h}" for h in hows) if hows else "")
    )


def _check_model(model: str) -> None:
    """A local HF folder, a cached hub id, or (online) a hub id the hub has (common.model_id)."""
    problem = model_problem(model)
    if problem:
        raise FileNotFoundError(f"{problem}. To get it: {HOW_TO_GET['model']}")
