"""A reference GRPO loop for a search agent, the proof that the shared machinery works end to end.

    questions -> agent rollouts (vLLM) -> reward (EM) -> advantages (GRPO) -> clipped update
              -> weights pushed into the engine -> next rollouts

It is one thin loop over ``common.rl_loop``, as the method trainers are; the reward and the
estimator come from the config (``reward.fn``, ``reward.advantage``: ``common.rewards``). Run it with
``python -m common.search_grpo --config common/configs/grpo_tiny.yaml [key=value ...]``.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from common.batches import BatchLog, group_grad_accum, rank_questions
from common.config import ConfigError, load_config
from common.data import DataError, load_qa
from common.retrieval.bm25 import BM25Retriever
from common.retrieval.client import HTTPRetriever
from common.rewards import (
    RewardConfig,
    RewardContext,
    StepScorer,
    check_step_scores,
    groups_of,
    load_part,
    step_layout,
    step_scorer_metrics,
)
from common.rl_loop import (
    EngineConfig,
    LossConfig,
    RunLoopConfig,
    all_ranks_mean,
    build_engine,
    dev_results_path,
    end_of_step,
    evaluate,
    group_shares,
    identical_group_share,
    logged_evals,
    plot_curve,
    result_line,
    rollout_metrics,
    update_and_push,
    write_samples,
)
from common.rollout import AgentConfig, run_agent
from common.rollout.batch import padding_id
from common.token_counts import rollout_token_metrics
from common.train import (
    MetricsLogger,
    TrainConfig,
    TrainEngine,
    iter_named_weights,
    load_checkpoint,
    load_for_training,
    progress,
)
from common.train.logging import LogConfig
from common.train.memory_plan import announce_plan
from common.train.run_folder import open_run_folder


@dataclass
class GRPORewardConfig(RewardConfig):
    """``RewardConfig`` plus an optional step scorer, for an estimator that takes step scores
    (``arco.advantages:DenseAdvantages``: ARCO's reward-to-go with bucket baselines)."""

    step_scorer: str = field(
        default="",
        metadata={
            "help": "one score per agent step, package.module:Name (e.g. "
            "experiments.step_scorers:TeacherEvidenceSteps, arco.step_scorer:RubricSteps); "
            "empty: none"
        },
    )
    step_scorer_args: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "keyword arguments for a step scorer that is a class, e.g. "
            "reward.step_scorer_args.folder=runs/arco/tiny/warmup"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.step_scorer_args and not self.step_scorer:
            raise ValueError("reward.step_scorer_args is set but reward.step_scorer is empty")
        needs = getattr(self.estimator(), "needs_step_scores", False)
        if needs and not self.step_scorer:
            raise ValueError(f"reward.advantage={self.advantage!r} needs step scores: set "
                             "reward.step_scorer=package.module:Name")  # fmt: skip
        self.scorer()

    def scorer(self) -> StepScorer | None:
        if not self.step_scorer:
            return None
        return load_part(
            self.step_scorer, "reward.step_scorer", "step scorer", {}, self.step_scorer_args
        )


@dataclass
class GRPOConfig(RunLoopConfig):
    """The reference GRPO run (the run loop's fields: ``RunLoopConfig``)."""

    DERIVED: ClassVar[dict[str, str]] = {  # set by train_grpo; refused in configs and overrides
        "train.grad_accum": "questions_per_step * n / ranks / loss.micro_batch_size",
        "train.seed": "seed",
    }

    world: str = field(default="runs/tinyworld/seed0", metadata={"help": "tiny world folder"})
    model: str = field(default="", metadata={"help": "HF model folder (default: <world>/model)"})
    train_file: str = field(default="", metadata={"help": "QA file (default: <world>/train.jsonl)"})
    dev_file: str = field(default="", metadata={"help": "QA file (default: <world>/dev.jsonl)"})
    corpus: str = field(default="", metadata={"help": "corpus (default: <world>/corpus.jsonl)"})
    retrieval_url: str = field(
        default="",
        metadata={"help": "a Search-R1 /retrieve endpoint to use instead of in-process BM25"},
    )
    run_dir: str = field(default="runs/grpo/tiny", metadata={"help": "output folder"})
    resume: bool = field(
        default=True, metadata={"help": "continue from run_dir's latest checkpoint if there is one"}
    )
    samples_per_step: int = field(
        default=4, metadata={"help": "rollouts written to samples/", "ge": 0}
    )
    agent: AgentConfig = field(default_factory=AgentConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    reward: GRPORewardConfig = field(default_factory=GRPORewardConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        if (self.questions_per_step * self.n) % self.loss.micro_batch_size:
            raise ValueError(
                f"questions_per_step*n = {self.questions_per_step * self.n} is not a multiple of "
                f"loss.micro_batch_size = {self.loss.micro_batch_size}"
            )

    def path(self, name: str) -> str:
        explicit = {
            "model": self.model,
            "train": self.train_file,
            "dev": self.dev_file,
            "corpus": self.corpus,
        }[name]
        default = {
            "model": "model",
            "train": "train.jsonl",
            "dev": "dev.jsonl",
            "corpus": "corpus.jsonl",
        }[name]
        return explicit or str(Path(self.world) / default)

    def check_assets(self) -> None:
        """Fail before any expensive work when an input is missing, saying how to get it."""
        keys = {"model": "model", "train": "train_file", "dev": "dev_file", "corpus": "corpus"}
        for name in ("model", "train", "dev") + (() if self.retrieval_url else ("corpus",)):
            p = Path(self.path(name))
            if not p.exists():
                raise FileNotFoundError(
                    f"{name} not found at {p}. Build the tiny world with "
                    f"`python -m common.tinyworld build --out {self.world}` or set "
                    f"`{keys[name]}=...`."
                )


def train_grpo(cfg: GRPOConfig) -> dict:
    """Run the loop; returns the first and last evaluation."""
    from transformers import AutoTokenizer

    # the batch is global: each rank's share, checked before any load (GRPOConfig.DERIVED)
    cfg.train.grad_accum = group_grad_accum(
        cfg.questions_per_step, "questions_per_step", cfg.n, "n",
        cfg.loss.micro_batch_size, "loss.micro_batch_size",
    )  # fmt: skip
    cfg.check_assets()
    # the data is read before the run folder opens and any model loads: a bad row costs nothing
    train_set = load_qa(cfg.path("train"))
    dev_set = load_qa(cfg.path("dev"))[: cfg.eval_questions]
    cfg.train.seed = cfg.seed
    run_dir = Path(cfg.run_dir)
    folder = open_run_folder(run_dir, cfg, cfg.resume, begin=False)  # lock, settings check
    tokenizer = AutoTokenizer.from_pretrained(cfg.path("model"))
    announce_plan(cfg)  # on a GPU: the memory plan, before the model loads
    model = load_for_training(cfg.path("model"), cfg.train, partition=cfg.loss.kl_coef == 0)
    train = TrainEngine(model, cfg.train, reference=cfg.loss.kl_coef > 0)
    if train.is_main:
        (run_dir / "samples").mkdir(exist_ok=True)
    engine = build_engine(
        cfg.engine, cfg.path("model"), train.model, tokenizer, cfg.seed + train.rank
    )
    retriever = (
        HTTPRetriever(cfg.retrieval_url)
        if cfg.retrieval_url
        else BM25Retriever.from_corpus(cfg.path("corpus"))
    )
    rng = random.Random(cfg.seed)
    order = list(range(len(train_set)))
    rng.shuffle(order)
    pad_id = padding_id(tokenizer)
    reward_fn, estimator = cfg.reward.reward_fn(), cfg.reward.estimator()
    step_scorer = cfg.reward.scorer()
    by_id = {q.id: q for q in train_set}  # a step scorer's ctx.extra['examples']
    folder.begin()  # every load-time check passed: record the settings, trim the log
    logger = MetricsLogger.from_config(run_dir, cfg.log, cfg) if train.is_main else None
    evals = []

    def run_eval(step: int) -> None:
        m = evaluate(
            engine,
            tokenizer,
            retriever,
            dev_set,
            cfg.agent,
            train.rank,
            train.world_size,
            results_path=dev_results_path(run_dir, step),
        )
        evals.append({"step": step, **m})
        if logger:
            logger.log(step, {f"dev/{k}": v for k, v in m.items()})
            print(f"[grpo] step {step}: dev EM {m['em']:.3f} F1 {m['f1']:.3f}", flush=True)

    start = 1
    latest = folder.checkpoint
    if latest is not None:
        # the data order is a function of (seed, step), so the step is the data position
        start = load_checkpoint(train, latest)["step"] + 1
        if cfg.engine.backend == "vllm":
            engine.push_weights(iter_named_weights(train))
        evals.extend(logged_evals(run_dir / "metrics.jsonl", before=start))
        if train.is_main:
            print(f"[grpo] resumed from {latest} at step {start}", flush=True)
    elif cfg.eval_every:  # 0: no dev evaluation
        run_eval(0)
    batch_log = BatchLog(run_dir, start, train.is_main)
    for step in progress(range(start, cfg.steps + 1), desc="grpo", total=cfg.steps):
        t_step = time.perf_counter()
        # this rank's contiguous share of the one-rank batch: a function of (seed, step)
        idx = rank_questions(step, train.rank, train.world_size, order, cfg.questions_per_step)
        qs = [train_set[i] for i in idx]
        timings: dict[str, float] = {}
        trajs = run_agent(
            engine,
            tokenizer,
            retriever,
            qs,
            cfg.n,
            cfg.agent,
            group_prefix=f"s{step}r{train.rank}:",
            seed=cfg.seed * 100003 + step,
            timings=timings,
        )
        ctx = RewardContext(train.model, tokenizer, engine, step, {"examples": by_id})
        out = reward_fn(groups_of(trajs), ctx)
        rewards = out.values
        step_scores = None
        if step_scorer is not None:
            t0 = time.perf_counter()
            raw = step_scorer(groups_of(trajs), ctx)
            step_scores = check_step_scores(
                raw, trajs, f"reward.step_scorer={cfg.reward.step_scorer!r}"
            )
            out.extras.update(step_layout(trajs))
            out.metrics.update(step_scorer_metrics(step_scorer))
            timings["step_scorer"] = time.perf_counter() - t0
        adv = estimator(out, [t.group_id for t in trajs], step_scores)
        upd = update_and_push(train, engine, trajs, adv, cfg.loss, cfg.engine, pad_id, timings)
        timings["step"] = time.perf_counter() - t_step
        batch_log.write(step, [q.id for q in qs], len(trajs))
        metrics = {
            **rollout_metrics(trajs),
            "reward": rewards.mean().item(),
            **group_shares(rewards, cfg.n),
            **identical_group_share(trajs, cfg.n),
            **out.metrics,
            **upd,
            **rollout_token_metrics(trajs),  # tokens/generation, shape/*: summed over ranks
            **{f"time/{k}": v for k, v in timings.items()},
        }
        metrics = all_ranks_mean(metrics, len(trajs))
        if logger:
            logger.log(step, metrics)
            write_samples(
                run_dir / "samples" / f"step_{step:05d}.json",
                trajs[: cfg.samples_per_step],
                rewards,
                tokenizer,
            )
        end_of_step(step, cfg, train, run_dir, tokenizer, run_eval)
    if logger:
        logger.close()
        if evals:
            plot_curve(evals, run_dir / "dev_curve.png")
    if not evals and cfg.eval_every:  # resumed at the end: evaluate once
        run_eval(cfg.steps)
    folder.close()
    return {
        "before": evals[0] if evals else None,
        "after": evals[-1] if evals else None,
        "evals": evals,
        "run_dir": str(run_dir),
        "model": train.model,
    }


def main(argv: list[str] | None = None) -> int:
    """The command line; a bad setting, a missing input or a bad QA file is one line and exit 2."""
    import argparse

    from common.config import describe_config
    from common.launcher import without_local_rank

    parser = argparse.ArgumentParser(
        description="Reference GRPO loop for a search agent.",
        epilog="overrides: dotted key=value, e.g. steps=20 train.lr=1e-3\n\n"
        + describe_config(GRPOConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default=None, help="YAML config")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(without_local_rank(argv))
    try:
        out = train_grpo(load_config(GRPOConfig, args.config, args.overrides))
    except (ConfigError, DataError, FileNotFoundError) as e:
        print(f"search_grpo: error: {e}", file=sys.stderr)
        return 2
    print(result_line(out))
    return 0


if __name__ == "__main__":
    from common.train.distributed import exit_process

    exit_process(main())
