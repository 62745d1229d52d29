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
from pathlib import Path

from common.batches import BatchLog, group_grad_accum, rank_questions
from common.config import ConfigError, load_config
from common.data import DataError, load_qa
from common.grpo_config import GRPOAssetsConfig, GRPOConfig, GRPORewardConfig  # noqa: F401
from common.retrieval.bm25 import BM25Retriever
from common.retrieval.client import HTTPRetriever
from common.rewards import (
    RewardContext,
    check_step_scores,
    groups_of,
    step_layout,
    step_scorer_metrics,
)
from common.rl_loop import (
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
from common.rollout import run_agent
from common.rollout.batch import padding_id
from common.token_counts import rollout_token_metrics
from common.train import (
    MetricsLogger,
    TrainEngine,
    iter_named_weights,
    load_checkpoint,
    load_for_training,
    progress,
)
from common.train.memory_plan import announce_plan
from common.train.run_folder import open_run_folder


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
        HTTPRetriever(cfg.assets.retrieval_url)
        if cfg.assets.retrieval_url
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
