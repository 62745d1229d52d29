"""μ of a trained ARCO folder as a standalone step scorer (``common.rewards.StepScorer``).

``RubricSteps`` loads μ (the base model with the ``rubric`` adapter and the score head) from an
ARCO folder, a warmup's output or a run's ``checkpoints/step_N``, frozen, and scores every agent
step as ARCO's dense phase does: μ writes K criteria for the step greedily (``rubric.mode``
adaptive; the fixed criteria or none as the ARCO config says), the head scores the step under
them, and s_t = mean_k d_{t,k}. Another trainer then gets ARCO's step credit from a μ that no
longer trains, e.g. the reference GRPO loop::

    python -m common.search_grpo --config common/configs/grpo_tiny.yaml \\
        reward.advantage=arco.advantages:DenseAdvantages \\
        reward.step_scorer=arco.step_scorer:RubricSteps \\
        reward.step_scorer_args.folder=runs/arco/tiny/warmup

μ reads text: each trajectory is decoded with the caller's tokenizer (``ctx.tokenizer``, the one
that wrote its ids) into ARCO's step view and μ's prompts are encoded with μ's own, so the policy
need not share μ's base. μ is a second model in the process (its own copy of the base, loaded at
the first call, on CUDA where there is one) and writes its criteria with HF generate, not the
caller's engine. Its budget statement counts from ``max_searches`` (default: the ARCO config's
``env.max_searches``); set it to the agent's budget where the two differ.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arco.config import ArcoConfig
from common.rewards import Group, RewardContext

DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "tiny.yaml")


@dataclass
class RubricSteps:
    """One score per agent step from a frozen μ (module docstring).

    ``folder``: the ARCO folder μ is read from (default: the config's latest checkpoint of
    ``run_dir``, else ``warmup_dir``); ``config`` and ``overrides``: the ARCO config μ was
    trained under (its base model, LoRA, rubric mode, prefix, K and prompt templates);
    ``max_searches``: the budget μ's prompts state (0: the config's ``env.max_searches``);
    ``batch_size``: rubric rows a scoring forward (0: the config's ``rl.score_batch_size``).
    The folder and the config are checked when the scorer is built; the model loads at the
    first call. After each call ``last_metrics`` holds what it counted (steps scored, invalid
    rubrics, time)."""

    folder: str = ""
    config: str = DEFAULT_CONFIG
    overrides: list[str] = field(default_factory=list)
    max_searches: int = 0
    batch_size: int = 0
    last_metrics: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        from arco.diagnose import default_checkpoint
        from arco.rubric_model import read_meta
        from arco.variants import load_variant

        if isinstance(self.overrides, str):
            raise ValueError(f"overrides must be a list of key=value, not {self.overrides!r}")
        self.cfg: ArcoConfig = load_variant(self.config, list(self.overrides), None)
        self.path = Path(self.folder) if self.folder else default_checkpoint(self.cfg)
        meta = read_meta(self.path)  # a clear error when it is no ARCO folder
        if self.max_searches < 0 or self.batch_size < 0:
            raise ValueError("max_searches and batch_size must be >= 0")
        if int(meta.get("k", self.cfg.head_k)) != self.cfg.head_k:
            raise ValueError(
                f"{self.path}: its head gives {meta['k']} scores a step; the config "
                f"{self.config} (rubric.mode={self.cfg.rubric_mode}, rubric.k="
                f"{self.cfg.rubric.k}) needs {self.cfg.head_k}: give the config μ was "
                "trained under (overrides=[rubric.k=...])"
            )
        self._mu: Any = None

    def _load(self) -> None:
        from arco.trainer import load_arco_folder
        from common.rollout import HFEngine

        model, tokenizer = load_arco_folder(self.cfg, self.path)
        model.eval()  # every use below is under no_grad (HF generate, score_items)
        self._mu = (model, tokenizer, HFEngine(model.lm, tokenizer))

    def __call__(self, groups: Sequence[Group], ctx: RewardContext) -> list[list[float]]:
        from arco.rubrics import score_items, step_rewards, write_criteria
        from arco.steps import episode_from_trajectory
        from arco.trainer import make_rubric_items
        from common.rollout.batch import padding_id

        t0 = time.perf_counter()
        if self._mu is None:
            self._load()
        model, tokenizer, engine = self._mu
        cfg = self.cfg
        trajs = [t for g in groups for t in g.trajectories]
        if not trajs:
            self.last_metrics = {}
            return []
        budget = self.max_searches or cfg.env.max_searches
        decoder = ctx.tokenizer if ctx.tokenizer is not None else tokenizer
        episodes = [episode_from_trajectory(t, decoder, budget) for t in trajs]
        items = make_rubric_items(cfg, episodes, tokenizer)
        invalid = 0
        if cfg.rubric_mode == "adaptive":
            invalid = write_criteria(
                engine, items, cfg.rubric.k, cfg.rubric.max_new_tokens, tokenizer.eos_token_id
            )
        batch = self.batch_size or cfg.rl.score_batch_size
        score_items(model, items, padding_id(tokenizer), batch, cfg.rubric.shared_prefix)
        scores = step_rewards(items, len(trajs))
        self.last_metrics = {
            "steps": float(len(items)),
            "criteria_valid_rate": 1.0 - invalid / len(items) if items else 1.0,
            "mean_score": sum(it.step_reward for it in items) / len(items) if items else 0.0,
            "seconds": time.perf_counter() - t0,
        }
        return scores
