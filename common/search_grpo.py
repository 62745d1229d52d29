"""A reference GRPO loop for a search agent, the proof that the shared machinery works end to end.

    questions -> agent rollouts (vLLM) -> reward (EM) -> advantages (GRPO) -> clipped update
              -> weights pushed into the engine -> next rollouts

It is one step function in the run frame (``common.run``), as the method trainers are; the
reward and the estimator come from the config (``reward.fn``, ``reward.advantage``:
``common.rewards``). At step 0 and the last step it also evaluates the run's held-out test split
(``held_out_split``) into ``test_results/``, beside ``dev_results/``. Run it with
``python -m common.search_grpo --config common/configs/grpo_tiny.yaml [key=value ...]``.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from common.config import ConfigError, load_config
from common.data import DataError
from common.grpo_config import GRPOAssetsConfig, GRPOConfig, GRPORewardConfig  # noqa: F401


def train_grpo(cfg: GRPOConfig) -> dict:
    """Run the loop; returns the first and last evaluation."""
    # imported here, not above: `--help` and a bad setting answer without torch
    from transformers import AutoTokenizer

    from common.batches import rank_questions
    from common.data import load_qa, question_char_limit
    from common.launcher import RunStopped
    from common.retrieval.bm25 import BM25Retriever
    from common.retrieval.client import HTTPRetriever, probe_retrieval
    from common.rewards import (
        RewardContext,
        check_step_scores,
        groups_of,
        step_layout,
        step_scorer_metrics,
    )
    from common.rl_loop import (
        build_engine,
        dev_results_path,
        evaluate,
        group_shares,
        held_out_results_path,
        identical_group_share,
        rollout_metrics,
        step_rollouts,
        write_samples,
    )
    from common.run import Run, StepBatch
    from common.token_counts import rollout_token_metrics
    from common.train import TrainEngine, load_for_training
    from common.train.memory_plan import announce_plan

    # the batch is global: each rank's share, checked before any load (GRPOConfig.DERIVED)
    cfg.set_grad_accum()
    cfg.check_assets()
    # the data is read before the run folder opens and any model loads: a bad row costs nothing
    # (over-long questions are counted skips: common.data's module docstring)
    chars = question_char_limit(cfg.agent.max_context, cfg.engine.max_model_len)
    train_set = load_qa(cfg.path("train"), max_question_chars=chars)
    dev_set = load_qa(cfg.path("dev"), max_question_chars=chars)[: cfg.eval_questions]
    test_file = held_out_split(cfg)  # evaluated at the start and the end, never chosen on
    test_set = (
        load_qa(test_file, max_question_chars=chars)[: cfg.eval_questions] if test_file else []
    )
    cfg.train.seed = cfg.seed
    run = Run("grpo", cfg)  # the run folder: lock, settings check
    try:
        probe_retrieval(cfg.assets.retrieval_url)  # every rank, before any model loads
    except RunStopped:
        run.close()
        raise
    tokenizer = AutoTokenizer.from_pretrained(cfg.path("model"))
    announce_plan(cfg)  # on a GPU: the memory plan, before the model loads
    model = load_for_training(cfg.path("model"), cfg.train, partition=cfg.loss.kl_coef == 0)
    train = TrainEngine(model, cfg.train, reference=cfg.loss.kl_coef > 0)
    engine = build_engine(
        cfg.engine, cfg.path("model"), train.model, tokenizer, cfg.seed + train.rank
    )
    retriever = (
        HTTPRetriever(cfg.assets.retrieval_url, max_wait=cfg.assets.retrieval_max_wait_s)
        if cfg.assets.retrieval_url
        else BM25Retriever.from_corpus(cfg.path("corpus"))
    )
    rng = random.Random(cfg.seed)
    order = list(range(len(train_set)))
    rng.shuffle(order)
    reward_fn, estimator = cfg.reward.reward_fn(), cfg.reward.estimator()
    step_scorer = cfg.reward.scorer()
    by_id = {q.id: q for q in train_set}  # a step scorer's ctx.examples

    def dev_eval(step: int) -> dict[str, float]:
        results = dev_results_path(run.dir, step)
        rank, world = train.rank, train.world_size
        if test_set and step in (0, cfg.steps):  # the start and the final policy on test
            path = held_out_results_path(run.dir, step)
            m = evaluate(
                engine,
                tokenizer,
                retriever,
                test_set,
                cfg.agent,
                rank,
                world,
                results_path=path,
                desc="test",
            )
            if train.is_main:
                print(f"[grpo] step {step}: held-out test EM {m['em']:.3f} ({path})", flush=True)
        return evaluate(
            engine, tokenizer, retriever, dev_set, cfg.agent, rank, world, results_path=results
        )

    def grpo_step(step: int) -> StepBatch:
        """n rollouts of each question -> rewards -> group advantages (the frame updates)."""
        # this rank's contiguous share of the one-rank batch: a function of (seed, step)
        idx = rank_questions(step, train.rank, train.world_size, order, cfg.questions_per_step)
        qs = [train_set[i] for i in idx]
        timings: dict[str, float] = {}
        trajs = step_rollouts(
            engine,
            tokenizer,
            retriever,
            qs,
            cfg.n,
            cfg.agent,
            step,
            train.rank,
            cfg.seed,
            timings=timings,
        )
        ctx = RewardContext(train.model, tokenizer, engine, step, examples=by_id)
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
        metrics = {
            **rollout_metrics(trajs),
            "reward": rewards.mean().item(),
            **group_shares(rewards, cfg.n),
            **identical_group_share(trajs, cfg.n),
            **out.metrics,
            **rollout_token_metrics(trajs),  # tokens/generation, shape/*: summed over ranks
        }
        shown = trajs[: cfg.samples_per_step]
        return StepBatch(
            trajs,
            adv,
            rewards,
            [q.id for q in qs],
            metrics,
            lambda path: write_samples(path, shown, rewards, tokenizer),
            timings,
        )

    run.begin(train, tokenizer, engine, dev_eval)  # every load-time check passed
    return run.fit(grpo_step)


def held_out_split(cfg: GRPOConfig) -> Path | None:
    """The run's held-out test split, as ``experiments.evaluate_all`` finds it: the world's
    test.jsonl when the run trains on the world's files (``assets.train`` empty), else the
    test.jsonl beside ``assets.train`` (``runs/smol/data/test.jsonl``); None when there is none."""
    train = cfg.assets.train
    test = Path(train).with_name("test.jsonl") if train else Path(cfg.assets.world) / "test.jsonl"
    return test if test.is_file() else None


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
    from common.rl_loop import result_line

    print(result_line(out))
    return 0


if __name__ == "__main__":
    from common.launcher import run_command

    run_command(main)
