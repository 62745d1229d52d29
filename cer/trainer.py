"""`cer train`: GRPO-family RL with the conditional expectation reward (or a baseline reward).

    per step: B prompts x G samples (engine) -> answer split on the sampled ids
              -> reward by type (exact | rule | cer | rule+cer | verifree), or reward.fn's
              -> RLOO advantage (r_k minus the mean of the other G-1; no std)
              -> clipped surrogate (eps 0.2), summed over tokens, averaged over sequences
              -> one optimizer step -> weights pushed into the engine

CER's scores come from ``hf_prefix_scorer`` on the training model under no_grad (a group's prompt
forwarded once, each solution once, every answer on the solution's cache), on any engine backend.
``reward.scorer=engine`` uses the engine's ``score`` instead (vLLM prompt logprobs: vLLM ignores
its prefix cache for requests with prompt logprobs, so each pair is prefilled whole; HF: each pair
forwarded whole). ``reward.frozen_scorer`` scores with a frozen copy of the initial policy.

Every dev evaluation (greedy) logs ``dev/*`` and, on the main rank, writes one row per dev problem
in dev order to ``run_dir/dev_results/step_N.jsonl`` (``cer.evaluate.problem_results``, gathered
from every rank): what ``experiments.compare`` pairs across runs.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import torch

from cer.config import CERConfig, RewardConfig, check_assets
from cer.evaluate import evaluate_problems, load_problems, problem_results
from cer.rewards.diagnostics import signal_metrics
from cer.rewards.groups import (
    REF_PROB,
    CERScoring,
    Group,
    GroupReward,
    GroupScores,
    common_groups,
    rules_of,
    scored_group_rewards,
    verifier_name,
)
from cer.rewards.scoring import ScoreFn, hf_prefix_scorer, ignoring_alternatives
from cer.rewards.scoring_tokens import CountingScorer
from cer.rewards.verifree import verifree_batch
from cer.rollout import sample_groups, step_sampling
from common.batches import group_grad_accum, rank_questions
from common.jsonl import write_jsonl_atomic
from common.rewards import RewardContext, Rewards, grpo, rloo
from common.rl_loop import (
    all_ranks_mean,
    build_engine,
    dev_results_path,
    gather_in_order,
    identical_group_share,
    plot_curve,
)
from common.rollout import HFEngine
from common.rollout.engine import SamplingConfig
from common.run import Run, StepBatch
from common.token_counts import rollout_token_metrics
from common.train import (
    TrainEngine,
    load_for_training,
)
from common.train.distributed import init_distributed
from common.train.memory_plan import announce_plan

ALL_TYPES = ("exact", "rule", "cer", "rule+cer", "verifree")
SIGNAL_TYPES = (*ALL_TYPES, REF_PROB)  # reward.signal: every type and pi(a*|s) on every group
ACCURACY_CURVES = (
    ("accuracy", "dev accuracy (rule/oracle)"),
    ("exact_accuracy", "dev exact match"),
)


def advantages(rewards: torch.Tensor, group_ids: list[str], kind: str) -> torch.Tensor:
    """rloo: A_k = r_k - 1/(G-1) sum_{j != k} r_j; grpo: (r_k - mean) / (std + eps)
    (``common.rewards``' estimators)."""
    return {"rloo": rloo, "grpo": grpo}[kind](Rewards(rewards), group_ids, None)


def step_signal(
    rewards: dict[str, torch.Tensor],
    ref_prob: torch.Tensor | None,
    trajs: list,
    kind: str,
    world: int,
) -> dict[str, float] | None:
    """``cer.rewards.diagnostics.signal_metrics`` over every rank's samples of the step (gathered: every rank
    calls it), on the main rank; None on the others."""
    rows = [
        (
            t.group_id,
            {k: v[i].item() for k, v in rewards.items()},
            float("nan") if ref_prob is None else ref_prob[i].item(),
        )
        for i, t in enumerate(trajs)
    ]
    rows = gather_in_order(rows, world)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    kinds = list(rows[0][1]) if rows else []
    return signal_metrics(
        {k: torch.tensor([r[1][k] for r in rows]) for k in kinds},
        torch.tensor([r[1]["rule"] for r in rows]) > 0.5,
        None if ref_prob is None else torch.tensor([r[2] for r in rows], dtype=torch.float64),
        [r[0] for r in rows],
        lambda r, ids: advantages(r, ids, kind),
    )


def make_score_fn(
    reward: RewardConfig,
    engine: Any,
    model: torch.nn.Module,
    frozen: torch.nn.Module | None,
    world: int = 1,
    zero_stage: int = 0,
) -> ScoreFn:
    """CER's scorer: ``hf_prefix_scorer`` on the frozen initial policy when given, else on the
    training model (it follows every update; the ranks of a ZeRO-3 model, ``zero_stage`` the
    run's ``train.zero_stage``, make equal forward counts), or the engine's ``score`` with
    ``reward.scorer=engine``."""
    if frozen is not None:
        return hf_prefix_scorer(frozen, reward.scorer_batch_size)
    if reward.scorer == "engine":
        return ignoring_alternatives(engine.score)
    zero3 = world > 1 and zero_stage == 3
    return hf_prefix_scorer(model, reward.scorer_batch_size, sync_ranks=zero3)


def train_cer(cfg: CERConfig) -> dict:
    """Run the loop; returns the dev evaluations and the run folder."""
    from transformers import AutoTokenizer

    train_cfg = cfg.train
    # the batch is global (B prompts over all ranks): each rank's share, checked before any load
    train_cfg.grad_accum = group_grad_accum(
        cfg.prompts_per_step,
        "prompts_per_step",
        cfg.group_size,
        "group_size",
        cfg.loss.micro_batch_size,
        "loss.micro_batch_size",
        "prompts",
    )
    check_assets(cfg.assets, ["model", "train", "dev"])
    train_cfg.seed = cfg.seed
    train_cfg.total_steps = cfg.steps
    init_distributed()
    tokenizer = AutoTokenizer.from_pretrained(cfg.assets.model)
    # the data (prompt lengths need the tokenizer) before the run folder opens and any model loads
    a = cfg.assets
    train_set, train_prompts = load_problems(
        a.train, tokenizer, cfg.max_prompt_tokens, a.train_format, a.train_filter
    )
    dev_set, dev_prompts = load_problems(a.dev, tokenizer, cfg.max_prompt_tokens)
    dev_set, dev_prompts = dev_set[: cfg.eval_questions], dev_prompts[: cfg.eval_questions]
    run = Run("cer", cfg)  # the run folder: lock, settings check
    whole = cfg.reward.frozen_scorer or cfg.loss.kl_coef > 0  # copied whole below
    announce_plan(cfg)  # on a GPU: the memory plan, before the model loads
    model = load_for_training(cfg.assets.model, train_cfg, partition=not whole)
    # Before the engine wraps the model (and before ZeRO-3 could partition it); a resumed run's
    # checkpoint loads into the training model only: the frozen scorer stays the initial policy.
    frozen = copy.deepcopy(model).eval().requires_grad_(False) if cfg.reward.frozen_scorer else None
    train = TrainEngine(model, train_cfg, reference=cfg.loss.kl_coef > 0)
    if frozen is not None:
        frozen.to(train.device)
    engine = build_engine(
        cfg.engine, cfg.assets.model, train.model, tokenizer, cfg.seed + train.rank
    )
    # the scorer, counting the tokens it forwards: tokens/reward (cer.rewards.scoring_tokens)
    score_fn = CountingScorer(
        make_score_fn(
            cfg.reward, engine, train.model, frozen, train.world_size, cfg.train.zero_stage
        ),
        whole=frozen is None and cfg.reward.scorer == "engine",
    )
    # HF engine on the training model: the scorer reads the samples' generation caches instead
    # of forwarding prompt and solution again (same model, same weights until the update). A
    # short answer's solution ends in tokens never sampled (cer.rollout): no cache to keep.
    reuse_kv = (
        isinstance(engine, HFEngine)
        and frozen is None
        and cfg.reward.scorer == "prefix"
        and not (train.world_size > 1 and cfg.train.zero_stage == 3)
        and not all(ex.metadata.get("short_answer") for ex in train_set)
    )
    # A sleeping engine frees its memory (CER-8B's scoring forward needs it) from the end of
    # generation to the weight push (Run.nap), unless the engine is the scorer.
    sleep_for_reward = cfg.reward.scorer != "engine"
    # The rule the dev accuracy is by: math-verify, letter, or the alias oracle (alias task).
    dev_verifier = "+".join(sorted({verifier_name(ex, rules_of(cfg.reward)) for ex in dev_set}))
    order = list(range(len(train_set)))
    random.Random(cfg.seed).shuffle(order)
    types = SIGNAL_TYPES if cfg.reward.signal else ()
    scoring = CERScoring(
        score_fn, cfg.reward.m, cfg.reward.m_selection, rules_of(cfg.reward), types
    )
    reward_fn, reward_name = cfg.reward.reward_fn(), cfg.reward.reward_name()
    # VeriFree as published trains the reference tokens too: only for its own reward
    verifree = isinstance(reward_fn, GroupReward) and reward_fn.type == "verifree"

    def dev_eval(step: int) -> dict[str, float]:
        shard = slice(train.rank, None, train.world_size)
        greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=cfg.max_response_tokens)
        m, rows = evaluate_problems(
            engine, tokenizer, dev_set[shard], dev_prompts[shard], greedy, scoring.rules, "dev eval"
        )
        m = all_ranks_mean(m, len(dev_set[shard]))
        m["correct"] = m["accuracy"]  # the per-problem field's name: experiments.compare's curves
        # Every rank's rows, in dev order (a collective: every rank calls it).
        results = gather_in_order(problem_results(rows), train.world_size)
        if train.is_main:
            write_jsonl_atomic(dev_results_path(run.dir, step), results)
        return m

    def accuracy_line(m: dict[str, float]) -> str:
        return (
            f"dev accuracy ({dev_verifier}) {m['accuracy']:.3f} "
            f"(exact {m['exact_accuracy']:.3f}, boxed {m['boxed_rate']:.3f})"
        )

    def rewards_by_type(
        out: Rewards, groups: list[Group]
    ) -> tuple[dict[str, torch.Tensor], dict[str, float], list[GroupScores] | None]:
        """Every reward type of the step's samples (exact and rule always: the accuracy), the
        CER summary and each group's CER scores (None when none were scored): the reward's own
        pass when it is CER's, else a pass beside it."""
        if "by_type" in out.extras:
            return out.extras["by_type"], out.metrics, out.extras.get("scores")
        by_type, stats, scores = scored_group_rewards(
            types, groups, score_fn, tokenizer, scoring.m, scoring.selection, scoring.rules
        )
        return by_type, {**stats, **out.metrics}, scores

    def cer_step(step: int) -> StepBatch:
        """B prompts x G samples -> reward by type -> RLOO advantages (the frame updates)."""
        # this rank's contiguous share of the one-rank batch: a function of (seed, step)
        idx = rank_questions(step, train.rank, train.world_size, order, cfg.prompts_per_step)
        params = step_sampling(cfg, step, train.rank, train.world_size, len(idx))
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        if reuse_kv:  # the scorer continues from the samples' own caches
            engine.keep_kv = True
        groups = sample_groups(
            engine,
            tokenizer,
            [train_set[i] for i in idx],
            [train_prompts[i] for i in idx],
            params,
            group_prefix=f"s{step}r{train.rank}:",
        )
        if reuse_kv:
            engine.keep_kv = False
        timings["generate"] = time.perf_counter() - t0
        if sleep_for_reward:  # the scorer forwards the training model beside no awake engine
            run.nap()  # measured on a GPU: a sleep that frees too little stops the run
        t0 = time.perf_counter()
        ctx = RewardContext(train.model, tokenizer, engine, step, scoring=scoring)
        out = reward_fn(common_groups(groups), ctx)
        rewards, cer_stats, scores = rewards_by_type(out, groups)
        ref_prob = rewards.pop(REF_PROB, None)
        timings["reward"] = time.perf_counter() - t0
        reward_tokens = score_fn.take()
        trajs = [t for g in groups for t in g.trajs]
        reward = out.values
        adv = advantages(reward, [t.group_id for t in trajs], cfg.reward.advantage)
        # Every reward type for the groups written to samples/, from the reward's scores: only
        # the pairs they lack are scored (none when they cover every solution; else a call on
        # every rank alike, the vLLM scorer is collective under several ranks).
        shown = groups[: cfg.samples_per_step]
        shown_rewards: dict[str, torch.Tensor] = {}
        shown_stats: dict[str, float] = {}
        if cfg.samples_per_step:  # 0 on every rank alike: no group to score, none written
            shown_rewards, shown_stats, _ = scored_group_rewards(
                ALL_TYPES,
                shown,
                score_fn,
                tokenizer,
                scoring.m,
                scoring.selection,
                scoring.rules,
                None if scores is None else scores[: len(shown)],
            )
        trained, trained_adv = trajs, adv
        if verifree and cfg.reward.verifree_likelihood:
            # the reference replaces the answer and is trained too
            trained, trained_adv = verifree_batch(groups, reward, adv, tokenizer)
        per_group = reward.view(-1, cfg.group_size)
        metrics = {
            "reward": reward.mean().item(),
            **{f"reward/{k}": v.mean().item() for k, v in rewards.items()},
            "accuracy": rewards["rule"].mean().item(),
            "boxed_rate": sum(t.answer is not None for t in trajs) / len(trajs),
            "response_tokens": sum(len(t.response_ids) for t in trajs) / len(trajs),
            "mixed_group_share": (
                (per_group.max(1).values > per_group.min(1).values).float().mean().item()
            ),
            **identical_group_share(trajs, cfg.group_size),
            **cer_stats,
            **{f"samples/reward/{k}": v.mean().item() for k, v in shown_rewards.items()},
            **{f"samples/{k}": v for k, v in shown_stats.items()},
            **rollout_token_metrics(trajs),
            "tokens/reward": reward_tokens,
            # what only samples/ needed scored (0 when the reward's scores cover its groups)
            "tokens/reward_samples": score_fn.take(),
        }
        pooled = {}
        if cfg.reward.signal:  # every rank's samples, pooled (a collective)
            pooled = step_signal(rewards, ref_prob, trajs, cfg.reward.advantage, train.world_size)
        return StepBatch(
            trained,
            trained_adv,
            reward,
            [train_set[i].id for i in idx],
            metrics,
            lambda path: write_samples(path, shown, shown_rewards, shown_stats, adv, tokenizer),
            timings,
            pooled or {},
        )

    def plot(evals: list[dict], path: Path) -> Path:
        xlabel = f"RL step (reward: {reward_name})"
        return plot_curve(evals, path, ACCURACY_CURVES, xlabel)

    run.begin(train, tokenizer, engine, dev_eval, describe=accuracy_line, plot=plot)
    out = run.fit(cer_step, desc=f"cer[{reward_name}]")
    if train.is_main:
        (run.dir / "dev_evals.json").write_text(json.dumps(out["evals"], indent=1))
    return out


def write_samples(
    path: Path,
    groups: list[Group],
    rewards: dict[str, torch.Tensor],
    stats: dict[str, float],
    adv: torch.Tensor,
    tokenizer,
) -> None:
    """Readable records of ``groups``: prompt, each response, its answer and every reward."""
    rows, k = [], 0
    for g in groups:
        samples = []
        for t, s in zip(g.trajs, g.splits, strict=True):
            samples.append(
                {
                    "response": tokenizer.decode(t.response_ids, skip_special_tokens=False),
                    "answer": s.answer,
                    "rewards": {name: r[k].item() for name, r in rewards.items()},
                    "advantage": adv[k].item(),
                }
            )
            k += 1
        rows.append(
            {
                "id": g.example.id,
                "prompt": tokenizer.decode(g.prompt_ids, skip_special_tokens=False),
                "reference": g.example.answer,
                "samples": samples,
            }
        )
    path.write_text(
        json.dumps({"cer_summary": stats, "groups": rows}, indent=1, ensure_ascii=False)
    )
