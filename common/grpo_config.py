"""The reference GRPO run's settings (``common.search_grpo``): its inputs (a tiny world's files
unless a key names another), the run loop's fields (``SearchRunConfig``) and its reward. A config
module: it loads no torch (tests/test_cli_fast.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from common.rewards import RewardConfig, StepScorerConfig
from common.run_config import SearchAssetsConfig, SearchRunConfig


@dataclass
class GRPORewardConfig(StepScorerConfig, RewardConfig):
    """``RewardConfig`` plus an optional step scorer (``StepScorerConfig``: empty, none), for an
    estimator that takes step scores (``arco.advantages:DenseAdvantages``: ARCO's reward-to-go
    with bucket baselines)."""

    def __post_init__(self) -> None:
        RewardConfig.__post_init__(self)
        StepScorerConfig.__post_init__(self)
        needs = getattr(self.estimator(), "needs_step_scores", False)
        if needs and not self.external:
            raise ValueError(
                f"reward.advantage={self.advantage!r} needs step scores: set "
                "reward.step_scorer=package.module:Name"
            )


@dataclass
class GRPOAssetsConfig(SearchAssetsConfig):
    """The reference run's inputs: a tiny world's files unless a key names another."""

    world: str = field(
        default="runs/tinyworld/seed0",
        metadata={"help": "tiny world folder: the default model, train, dev and corpus"},
    )
    model: str = field(default="", metadata={"help": "HF model folder (default: <world>/model)"})
    train: str = field(default="", metadata={"help": "QA file (default: <world>/train.jsonl)"})
    dev: str = field(default="", metadata={"help": "QA file (default: <world>/dev.jsonl)"})
    corpus: str = field(default="", metadata={"help": "corpus (default: <world>/corpus.jsonl)"})


@dataclass
class GRPOConfig(SearchRunConfig):
    """The reference GRPO run (the run loop's fields: ``SearchRunConfig``)."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by train_grpo; refused in configs and overrides
        "train.grad_accum": "questions_per_step * n / ranks / loss.micro_batch_size",
        "train.seed": "seed",
    }
    RENAMED: ClassVar[dict[str, str]] = {  # docs/configuration.md
        "world": "assets.world",
        "model": "assets.model",
        "train_file": "assets.train",
        "dev_file": "assets.dev",
        "corpus": "assets.corpus",
        "retrieval_url": "assets.retrieval_url",
    }

    run_dir: str = field(default="runs/grpo/tiny", metadata={"help": "output folder"})
    assets: GRPOAssetsConfig = field(default_factory=GRPOAssetsConfig)
    reward: GRPORewardConfig = field(default_factory=GRPORewardConfig)

    def path(self, name: str) -> str:
        """``assets.<name>`` (model, train, dev, corpus), by default the world's file."""
        explicit = getattr(self.assets, name)
        default = {
            "model": "model",
            "train": "train.jsonl",
            "dev": "dev.jsonl",
            "corpus": "corpus.jsonl",
        }[name]
        return explicit or str(Path(self.assets.world) / default)

    def check_assets(self) -> None:
        """Fail before any expensive work when an input is missing, saying how to get it."""
        for name in ("model", "train", "dev") + (() if self.assets.retrieval_url else ("corpus",)):
            p = Path(self.path(name))
            if not p.exists():
                raise FileNotFoundError(
                    f"{name} not found at {p}. Build the tiny world with "
                    f"`python -m common.tinyworld build --out {self.assets.world}` or set "
                    f"`assets.{name}=...`."
                )
