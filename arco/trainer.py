"""ARCO co-evolution RL (docs/arco_internals.md; the paper's "Co-evolution RL"): π and μ on one backbone, both
updated on every batch.

    questions -> π rollouts (engine, adapter "policy") -> episodes (text view)
      -> μ's criteria for every step, one engine call (adapter "rubric")
      -> step scores d_t from the head, s_t = mean_k d_t: μ's update forward (with gradient,
         no LoRA dropout; L_μ's backward taken there, rl.mu_single_forward), or a no-grad
         scoring forward before the update's
      -> advantages: sparse phase A = R − group mean; dense phase A_t = c·(G_t − b_bucket)
      -> one optimizer step on  L_π + L_μ  (π's and μ's adapters and the head, own rates;
         the run frame's, given ``update``) -> both adapters pushed -> next batch

    L_π = Σ_τ Σ_t [ −A_t Σ_tokens log π(a_t) + κ · tokenmean KL(π‖π_ref) ] / B     (κ: dense only)
    L_μ = Σ_τ [ w_τ (Σ_t s_t − R(τ))² + β Σ_t tokenmean KL_t(μ‖μ_ref) ] / B
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from arco.advantages import dense_advantages, position_buckets, sparse_group_advantages
from arco.config import ArcoConfig
from arco.environment import build_environment
from arco.losses import (
    class_weights,
    decomposition_loss,
    masked_token_mean,
    policy_step_loss,
    scatter_positions,
    token_kl,
)
from arco.rubric_model import ArcoModel, build_arco_model, read_meta
from arco.rubric_prompt import read_criteria_file
from arco.rubrics import (
    RubricItem,
    compute_dtype,
    rubric_batch,
    rubric_items,
    score_items,
    step_rewards,
    trunk_batch,
    write_criteria,
)
from arco.step_tokens import arco_token_metrics
from arco.steps import Episode, episode_from_trajectory
from common.batches import check_micro_batches, data_world_size, per_rank, rank_slice
from common.config import ConfigError
from common.launcher import RunStopped
from common.retrieval.client import probe_retrieval
from common.rewards import (
    RewardContext,
    StepScorer,
    check_step_scores,
    groups_of,
    step_scorer_metrics,
)
from common.rl import entropy_from_logits, logprobs_from_logits
from common.rl_loop import (
    build_engine,
    dev_results_path,
    evaluate,
    group_shares,
    identical_group_share,
    response_length_metrics,
    rollout_metrics,
    step_rollouts,
)
from common.rollout import Trajectory
from common.rollout.batch import collate, padding_id
from common.run import Run, StepBatch
from common.train import (
    TrainEngine,
)
from common.train.engine import dropout_off, eval_mode
from common.train.memory_plan import announce_plan

# Logit rows a time in π's entropy metric (one [rows, vocab] float32 temporary)
ENTROPY_CHUNK = 1024


@dataclass
class ArcoBatch(StepBatch):
    """A step's batch with what ARCO's joint update reads besides π's: μ's items (criteria,
    scores) for the decomposition loss, whether π's dense-phase KL is on (``late``), and
    whether μ's micro-steps were taken in the step already (``mu_done``,
    ``rl.mu_single_forward``). ``advantages``: one per agent step of each trajectory."""

    items: Sequence[RubricItem] = ()
    late: bool = False
    mu_done: bool = False


def update_batch(
    trajs: Sequence[Trajectory],
    items: Sequence[RubricItem],
    step_adv: Sequence[Sequence[float]],
    rewards: torch.Tensor,
    late: bool = False,
    mu_done: bool = False,
) -> ArcoBatch:
    """The update's inputs alone, without a step's record: what calling ``update`` outside the
    run frame needs (a benchmark, a check of one update)."""
    return ArcoBatch(
        list(trajs),
        [list(a) for a in step_adv],
        rewards,
        [],
        {},
        lambda path: None,
        items=items,
        late=late,
        mu_done=mu_done,
    )


def push_adapters(engine, model: ArcoModel) -> None:
    """Both adapters' current weights into a vLLM engine, woken first if it sleeps (an HF
    engine shares the model)."""
    if getattr(engine, "asleep", False):
        engine.wake_up()
    if hasattr(engine, "push_adapter"):
        for name in ("policy", "rubric"):
            engine.push_adapter(name, model.lm, name)


def rubric_settings(cfg: ArcoConfig) -> dict:
    """What μ's training depends on, written into ``arco.json`` and checked when loading it."""
    r = cfg.rubric
    return {"mode": cfg.rubric_mode, "prefix": r.prefix, "k": r.k, "request_in": r.request_in}


def check_rubric_matches(cfg: ArcoConfig, model: ArcoModel, where: str) -> None:
    """μ loaded from ``where`` must have been trained for this config's rubric: the head's size,
    the mode, and the prefix (before and after differ only by the release's RL bug)."""
    if model.k != cfg.head_k:
        raise ValueError(
            f"{where}: its head gives {model.k} scores a step; rubric.mode={cfg.rubric_mode} "
            f"rubric.k={cfg.rubric.k} needs {cfg.head_k} (run the warmup with these)"
        )
    meta = model.rubric_meta or {}
    if "mode" in meta and meta["mode"] != cfg.rubric_mode:
        raise ValueError(
            f"{where}: μ was trained with rubric.mode={meta['mode']}, this run has "
            f"{cfg.rubric_mode} (run the warmup with the same rubric settings)"
        )
    trained_in = meta.get("request_in", "user")  # folders written before the option: user
    if cfg.rubric_mode != "none" and trained_in != cfg.rubric.request_in:
        raise ValueError(
            f"{where}: μ was trained with rubric.request_in={trained_in}, this run has "
            f"{cfg.rubric.request_in} (run the warmup with the same rubric settings)"
        )
    prefixes = {meta.get("prefix", cfg.rubric.prefix), cfg.rubric.prefix}
    if len(prefixes) > 1 and "none" in prefixes:
        raise ValueError(
            f"{where}: μ was trained with rubric.prefix={meta['prefix']}, this run has "
            f"{cfg.rubric.prefix} (run the warmup with the same rubric settings)"
        )


def load_arco_folder(cfg: ArcoConfig, folder: Path) -> tuple[ArcoModel, object]:
    """An ARCO folder's model (base, adapters, head) for use outside training, on CUDA where
    there is one, in the dtype training used, checked against ``cfg``'s rubric; and the tokenizer."""
    from transformers import AutoTokenizer

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = cfg.train.weights_dtype()  # as in training
    model = build_arco_model(
        cfg.assets.model, cfg.lora.as_peft(), cfg.head_k, folder, dtype=dtype
    ).to(device)
    check_rubric_matches(cfg, model, str(folder))
    return model, AutoTokenizer.from_pretrained(cfg.assets.model)


def make_rubric_items(cfg: ArcoConfig, episodes: Sequence[Episode], tokenizer) -> list[RubricItem]:
    """μ's items for every step of ``episodes`` under the config's rubric (mode, prefix, K)."""
    r, mode = cfg.rubric, cfg.rubric_mode
    fixed = read_criteria_file(r.criteria_file, r.k) if mode == "fixed" else None
    return rubric_items(
        episodes, tokenizer, r.k, r.prefix, r.max_obs_chars, mode, fixed, **r.templates()
    )


def external_step_scores(
    scorer: StepScorer, trajs: Sequence[Trajectory], ctx: RewardContext, name: str
) -> list[list[float]]:
    """``scorer``'s s_t for every step of ``trajs`` (``reward.step_scorer``, in μ's place),
    checked: one finite score per agent step (``common.rewards.check_step_scores``)."""
    return check_step_scores(scorer(groups_of(trajs), ctx), trajs, f"reward.step_scorer={name!r}")


def all_ranks(obj):
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` in one process."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _mine(per_rank: Sequence[Sequence], rank: int) -> slice:
    """This rank's rows in the concatenation of ``per_rank``."""
    start = sum(len(x) for x in per_rank[:rank])
    return slice(start, start + len(per_rank[rank]))


def global_dense_advantages(
    step_rews: list[list[float]], kinds: list[list[str]], c: float, invalid_bucket: bool, rank: int
) -> list[list[float]]:
    """``dense_advantages`` with the bucket baselines over the whole batch (all ranks), as one
    process with the ranks' trajectories would compute them; this rank's rows."""
    per_rank = all_ranks((step_rews, kinds))
    flat = [x for r, _ in per_rank for x in r], [x for _, k in per_rank for x in k]
    return dense_advantages(*flat, c, invalid_bucket)[_mine([r for r, _ in per_rank], rank)]


def global_class_weights(rewards: torch.Tensor, rank: int) -> torch.Tensor:
    """``class_weights`` over the whole batch (all ranks); this rank's rows."""
    per_rank = all_ranks(rewards.tolist())
    every = torch.tensor([x for r in per_rank for x in r], dtype=rewards.dtype)
    return class_weights(every)[_mine(per_rank, rank)]


def _per_token(traj: Trajectory, per_step: Sequence[float]) -> list[float]:
    """A value per response token: step t's value on its sampled tokens, 0 elsewhere."""
    out = [0.0] * len(traj.response_ids)
    for s, v in zip(traj.steps, per_step, strict=True):
        out[s.start : s.end] = [v] * (s.end - s.start)
    return out


def _place(
    trajs: Sequence[Trajectory], rows: Sequence[Sequence[float]], width: int
) -> torch.Tensor:
    """Response-aligned rows into collate's label-aligned layout [B, width-1]."""
    out = torch.zeros((len(trajs), width - 1))
    for i, (t, row) in enumerate(zip(trajs, rows, strict=True)):
        p = len(t.prompt_ids)
        if row:
            out[i, p - 1 : p - 1 + len(row)] = torch.tensor(row)
    return out


def policy_loss(
    train: TrainEngine,
    trajs: Sequence[Trajectory],
    step_adv: Sequence[Sequence[float]],
    kl_coef: float,
    direction: str,
    pad_id: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ over ``trajs`` of −Σ_t A_t Σ_tokens log π(a_t) + κ Σ_t tokenmean_t KL(π‖π_ref)."""
    batch = collate(trajs, pad_id).to(train.device)
    width = batch.input_ids.shape[1]
    adv = _place(trajs, [_per_token(t, a) for t, a in zip(trajs, step_adv, strict=True)], width)
    step_of = _place(trajs, [_per_token(t, range(1, len(t.steps) + 1)) for t in trajs], width).to(
        train.device
    )  # step number per label position, 0 = not sampled
    # the positions that count: sampled tokens (loss) and the steps' tokens (KL), label-aligned
    where = batch.loss_mask.bool() | (step_of > 0) if kl_coef > 0 else batch.loss_mask.bool()
    at = F.pad(where, (0, 1))  # [B, T]: position t predicts token t+1
    logits, _ = train("policy", batch.input_ids, batch.attention_mask, logit_mask=at)  # [n, V]
    logp = scatter_positions(logprobs_from_logits(logits, batch.input_ids[:, 1:][where]), where)
    loss = policy_step_loss(logp, adv.to(train.device), batch.loss_mask)
    # mean |log pi_train - log pi_engine| over the sampled tokens: another model or other
    # positions in the engine than in training show here (the update averages it over chunks)
    gap = (logp.detach() - batch.sampling_logprobs).abs() * batch.loss_mask
    stats = {"pi_kl": 0.0, "logprob_gap": (gap.sum() / batch.loss_mask.sum().clamp(min=1)).item()}
    # π's entropy at the sampled tokens, from these logits (no gradient); ``update`` makes the
    # token mean of the sums
    sampled = batch.loss_mask.bool()[where]  # [n]: which logit rows are sampled tokens'
    entropy = entropy_from_logits(logits[sampled], ENTROPY_CHUNK, detached=True)
    stats |= {"entropy_sum": float(entropy.sum()), "entropy_tokens": float(sampled.sum())}
    if kl_coef > 0:
        with torch.no_grad(), eval_mode(train.model):  # the reference without LoRA dropout
            ref_logits, _ = train.model(
                "policy_ref", batch.input_ids, batch.attention_mask, logit_mask=at
            )
        kl_tok = scatter_positions(token_kl(logits, ref_logits, direction), where)  # [B, T-1]
        kl = torch.zeros(len(trajs), device=train.device)
        for s in range(1, int(step_of.max().item()) + 1):
            kl = kl + masked_token_mean(kl_tok, (step_of == s).float())
        loss = loss + kl_coef * kl
        stats["pi_kl"] = kl.mean().item()
    return loss.sum(), stats


@dataclass(frozen=True)
class MuMicroBatch:
    """L_μ's input for the trajectories ``first .. first + len(outcomes) - 1``: their rubric rows
    (``items``, whose ``traj`` counts from 0 over the whole batch), outcomes R_τ and class
    weights w_τ."""

    items: Sequence[RubricItem]
    outcomes: torch.Tensor  # [n]
    weights: torch.Tensor  # [n]
    first: int = 0

    @property
    def n_trajs(self) -> int:
        return int(self.outcomes.shape[0])


@dataclass(frozen=True)
class MuLoss:
    """L_μ's settings: β (``rl.mu_kl_coef``), the KL's direction (``rl.kl_direction``), one
    trunk a trajectory (``rubric.shared_prefix``) and the padding id."""

    beta: float
    direction: str
    shared: bool
    pad_id: int

    @classmethod
    def of(cls, cfg: ArcoConfig, pad_id: int) -> MuLoss:
        return cls(cfg.rl.mu_kl_coef, cfg.rl.kl_direction, cfg.rubric.shared_prefix, pad_id)


def _mu_micro_batch(
    by_traj: dict[int, list[RubricItem]],
    rewards: torch.Tensor,
    weights: torch.Tensor,
    chunk: range,
    device: torch.device,
) -> MuMicroBatch:
    """The micro-batch ``chunk`` of trajectories' rows, outcomes and weights on ``device``."""
    return MuMicroBatch(
        [it for i in chunk for it in by_traj.get(i, [])],
        rewards[chunk.start : chunk.stop].to(device),
        weights[chunk.start : chunk.stop].to(device),
        chunk.start,
    )


def rubric_loss(
    train: TrainEngine, mb: MuMicroBatch, loss_cfg: MuLoss, record: bool = False
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ over ``mb``'s trajectories of w_τ (Σ_t s_t − R)² + β Σ_t tokenmean KL_t(μ‖μ_ref),
    scores recomputed with gradient through the head and the rubric adapter (``record``: their
    detached values written into the items, the step scores of the advantages). With
    ``loss_cfg.shared`` (``rubric.shared_prefix``) each trajectory's rows are forwarded as one
    trunk (``trunk_batch``), for μ and μ_ref alike; else one row a step."""
    items, beta, direction = mb.items, loss_cfg.beta, loss_cfg.direction
    n_trajs, shared, pad_id = mb.n_trajs, loss_cfg.shared, loss_cfg.pad_id
    if shared:
        tb = trunk_batch(items, pad_id, train.device, compute_dtype(train.model))
        kl_on = beta > 0 and tb.crit_at.numel() > 0
        at = tb.logit_mask & kl_on
        fwd = {"pool_mask": tb.pool, "position_ids": tb.positions}
        logits, scores = train("rubric", tb.ids, tb.mask, logit_mask=at, **fwd)  # [n, V]
        scores = tb.item_scores(scores)  # [M, K]
    else:
        ids, attn, crit = rubric_batch(items, pad_id, train.device)
        kl_on = beta > 0 and bool(crit.any())  # fixed criteria or none: nothing of μ's to hold
        at = F.pad(crit.bool() & kl_on, (0, 1))  # [M, T]: logits at the criteria positions only
        logits, scores = train("rubric", ids, attn, pool_mask=attn, logit_mask=at)  # [n, V]
    if record:
        for it, row in zip(items, scores.detach().tolist(), strict=True):
            it.scores = row
    s = scores.mean(-1)  # [M] step rewards s_t
    n_steps = max(it.step for it in items) + 1
    step_scores = torch.zeros((n_trajs, n_steps), device=train.device)
    step_mask = torch.zeros((n_trajs, n_steps), device=train.device)
    rows = torch.tensor([it.traj - mb.first for it in items], device=train.device)
    cols = torch.tensor([it.step for it in items], device=train.device)
    step_scores = step_scores.index_put((rows, cols), s)
    step_mask[rows, cols] = 1.0
    decomp = decomposition_loss(step_scores, step_mask, mb.outcomes, mb.weights)  # [n_trajs]
    loss = decomp.sum()
    stats = {"mu_decomp_loss": decomp.mean().item(), "mu_kl": 0.0}
    if kl_on and shared:
        with torch.no_grad(), eval_mode(train.model):
            ref_logits, _ = train.model("rubric_ref", tb.ids, tb.mask, logit_mask=at, **fwd)
        kl_pos = token_kl(logits, ref_logits, direction)  # [n]: each packed position once
        kl = tb.item_mean(kl_pos[tb.crit_at], len(items))  # [M] token means
        loss = loss + beta * kl.sum()
        stats["mu_kl"] = kl.sum().item() / n_trajs
    elif kl_on:
        with torch.no_grad(), eval_mode(train.model):
            ref_logits, _ = train.model("rubric_ref", ids, attn, logit_mask=at)
        kl_tok = scatter_positions(token_kl(logits, ref_logits, direction), crit.bool())
        kl = masked_token_mean(kl_tok, crit)
        loss = loss + beta * kl.sum()
        stats["mu_kl"] = kl.sum().item() / n_trajs
    return loss, stats


def _micro_batches(n: int, size: int) -> list[range]:
    """The update's micro-batches of trajectories: consecutive ranges of ``size``."""
    return [range(a, min(a + size, n)) for a in range(0, n, size)]


def _by_traj(items: Sequence[RubricItem]) -> dict[int, list[RubricItem]]:
    out: dict[int, list[RubricItem]] = {}
    for it in items:
        out.setdefault(it.traj, []).append(it)
    return out


def mu_single_forward(cfg: ArcoConfig) -> bool:
    """Whether μ's scoring forward is its update's: ``rl.mu_single_forward`` with μ in the run
    and trained. Then an update is two micro-steps a micro-batch of trajectories (grad_accum),
    μ's (``rubric_update``) and then π's (``update``)."""
    return cfg.rl.mu_single_forward and not cfg.mu_frozen


def rubric_update(
    train: TrainEngine,
    items: Sequence[RubricItem],
    rewards: torch.Tensor,
    cfg: ArcoConfig,
    pad_id: int,
    timings: dict[str, float],
) -> dict[str, float]:
    """μ's half of the update with one forward of its rows (``rl.mu_single_forward``): per
    micro-batch of trajectories L_μ with gradient, its backward and a micro-step of the engine,
    the detached scores written into the items for the advantages. The model stays in training
    mode, so HF's gradient checkpointing holds (it checkpoints a layer only in training mode),
    with every dropout off (``dropout_off``): the scores are ``score_items``'s, the
    deterministic μ's (the release's scores for the advantages are eval-mode too; its μ update
    has dropout on). Run it before the advantages; ``update(..., mu_done=True)`` adds π's
    micro-steps to the same optimizer step."""
    rl = cfg.rl
    n = rewards.shape[0]
    chunks = _micro_batches(n, rl.micro_batch_size)
    factor = train.config.grad_accum / len(chunks)  # the engine divides by grad_accum
    weights = global_class_weights(rewards, train.rank)
    by_traj = _by_traj(items)
    loss_cfg = MuLoss.of(cfg, pad_id)
    stats: dict[str, float] = {}
    with dropout_off(train.model):
        for chunk in chunks:
            t0 = time.perf_counter()
            mb = _mu_micro_batch(by_traj, rewards, weights, chunk, train.device)
            if mb.items:
                l_mu, s_mu = rubric_loss(train, mb, loss_cfg, record=True)
                train.backward(l_mu * (factor / len(chunk)))
                for k, v in {**s_mu, "loss_mu": l_mu.item()}.items():
                    stats[k] = stats.get(k, 0.0) + v / len(chunks)
            train.step()
            timings["mu_update"] = timings.get("mu_update", 0.0) + time.perf_counter() - t0
    return stats


def update(train: TrainEngine, batch: ArcoBatch, cfg: ArcoConfig, pad_id: int) -> dict[str, float]:
    """One optimizer step on L_π + L_μ over the batch, cut into micro-batches of trajectories
    (the engine averages its grad_accum micro-steps, so each micro-batch's sum is divided by its
    size and scaled by grad_accum / micro-batches). With μ frozen (``ArcoConfig.mu_frozen``:
    ``rl.freeze_rubric``, PRM, outcome-only, an external step scorer) L_μ is not computed; with
    ``batch.mu_done`` ``rubric_update`` has taken μ's micro-steps already and this one adds
    π's. Seconds of each half into ``batch.timings``."""
    trajs, items, step_adv = batch.trajectories, batch.items, batch.advantages
    rewards, late, mu_done, timings = batch.rewards, batch.late, batch.mu_done, batch.timings
    mbs = cfg.rl.micro_batch_size
    train_mu = not cfg.mu_frozen and not mu_done
    weights = global_class_weights(rewards, train.rank)
    by_traj = _by_traj(items)
    chunks = _micro_batches(len(trajs), mbs)
    factor = train.config.grad_accum / len(chunks)
    loss_cfg = MuLoss.of(cfg, pad_id)
    lrs = {g["name"]: float(g["lr"]) for g in train.optimizer.param_groups if "name" in g}
    stats: dict[str, float] = {}
    info: dict = {}
    for chunk in chunks:
        t0 = time.perf_counter()
        l_pi, s_pi = policy_loss(
            train,
            [trajs[i] for i in chunk],
            [step_adv[i] for i in chunk],
            cfg.rl.pi_kl_coef if late else 0.0,
            cfg.rl.kl_direction,
            pad_id,
        )
        t1 = time.perf_counter()
        l_mu, s_mu = torch.zeros((), device=train.device), {}
        if train_mu:
            mb = _mu_micro_batch(by_traj, rewards, weights, chunk, train.device)
            l_mu, s_mu = rubric_loss(train, mb, loss_cfg)
        t2 = time.perf_counter()
        train.backward((l_pi + l_mu) * (factor / len(chunk)))
        info = train.step()
        t3 = time.perf_counter()
        # the backward's share is split by the two forwards' shares
        fwd_pi, fwd_mu = t1 - t0, t2 - t1
        share = fwd_pi / max(fwd_pi + fwd_mu, 1e-9)
        timings["pi_update"] = timings.get("pi_update", 0.0) + fwd_pi + share * (t3 - t2)
        timings["mu_update"] = timings.get("mu_update", 0.0) + fwd_mu + (1 - share) * (t3 - t2)
        mine = {**s_pi, **s_mu, "loss_pi": l_pi.item()}
        if not mu_done:
            mine["loss_mu"] = l_mu.item()
        for k, v in mine.items():
            stats[k] = stats.get(k, 0.0) + v
    entropy_sum, tokens = stats.pop("entropy_sum"), stats.pop("entropy_tokens")
    out = {k: v / len(chunks) for k, v in stats.items()}
    out["entropy"] = entropy_sum / tokens if tokens else float("nan")
    out |= {"lr": lrs.get("policy", float("nan")), **{f"lr/{k}": v for k, v in lrs.items()}}
    out["clip_frac"] = 0.0  # π's loss is -A log π, with no ratio: nothing is clipped
    out |= response_length_metrics(list(trajs))
    out["train_mode"] = float(train.model.training)  # 0: dropout and checkpointing are off
    out["grad_norm"] = (
        float(info["grad_norm"]) if info.get("grad_norm") is not None else float("nan")
    )
    # π and μ are clipped apart (the release): each one's norm before its clip
    out |= {k: float(v) for k, v in info.items() if k.startswith("grad_norm/")}
    return out


def skipped_update(train: TrainEngine, batch: ArcoBatch) -> dict[str, float]:
    """``update``'s statistics for an update the frame skipped before its first micro-batch
    (non-finite rewards or advantages): nothing measured (NaN), the rates as they stand."""
    nan = float("nan")
    lrs = {g["name"]: float(g["lr"]) for g in train.optimizer.param_groups if "name" in g}
    out = {"loss_pi": nan, "entropy": nan, "clip_frac": nan, "grad_norm": nan}
    out |= {} if batch.mu_done else {"loss_mu": nan}
    out |= {"lr": lrs.get("policy", nan), **{f"lr/{k}": v for k, v in lrs.items()}}
    out |= response_length_metrics(list(batch.trajectories))
    return out | {"train_mode": float(train.model.training)}


def rubric_metrics(
    items: Sequence[RubricItem],
    kinds: Sequence[Sequence[str]],
    rewards: torch.Tensor,
    invalid_bucket: bool,
) -> dict[str, float]:
    """Criteria validity, decomposition error |Σ_t s_t − R|, step-score mean/std per bucket."""
    n = len(kinds)
    s = step_rewards(items, n)
    err = [abs(sum(s[i]) - rewards[i].item()) for i in range(n)]
    out = {
        "decomposition_error": sum(err) / max(n, 1),
        "steps_per_trajectory": len(items) / max(n, 1),
    }
    written = [it for it in items if it.written]
    if written:  # only μ's own criteria can be invalid (mode adaptive)
        out["criteria_valid_rate"] = sum(it.criteria is not None for it in written) / len(written)
    by_bucket: dict[str, list[float]] = {}
    for i in range(n):
        for b, v in zip(position_buckets(kinds[i], invalid_bucket), s[i], strict=True):
            by_bucket.setdefault(b, []).append(v)
    # buckets over all ranks: each rank may see other buckets, and every rank must log the same keys
    merged: dict[str, list[float]] = {}
    for part in all_ranks(by_bucket):
        for b, vals in part.items():
            merged.setdefault(b, []).extend(vals)
    for b, vals in sorted(merged.items()):
        t = torch.tensor(vals)
        out[f"step_score/{b}/mean"] = t.mean().item()
        out[f"step_score/{b}/std"] = t.std(unbiased=False).item()
    return out


def write_samples(
    path: Path,
    episodes,
    items: Sequence[RubricItem],
    step_adv: Sequence[Sequence[float]],
    k: int,
    step_scores: Sequence[Sequence[float]] | None = None,
) -> None:
    """The first ``k`` trajectories, readable: each action with its criteria, scores, advantage
    (``step_scores``: an external step scorer's s_t, in μ's place)."""
    rows = []
    for i, ep in enumerate(episodes[:k]):
        mine = {it.step: it for it in items if it.traj == i}  # none without μ (outcome-only)
        theirs = step_scores[i] if step_scores is not None else None
        total = sum(theirs) if theirs is not None else sum(it.step_reward for it in mine.values())
        rows.append(
            {
                "question": ep.question,
                "golden_answers": ep.golden_answers,
                "answer": ep.answer,
                "reward": ep.reward,
                "sum_step_scores": total,
                "steps": [
                    {
                        "kind": st.kind,
                        "action": st.action,
                        "observation": st.observation,
                        "searches_left": st.searches_left,
                        **(_rubric_view(mine[t]) if t in mine else {}),
                        **({"step_score": round(theirs[t], 4)} if theirs is not None else {}),
                        "advantage": round(a, 4),
                    }
                    for t, (st, a) in enumerate(zip(ep.steps, step_adv[i], strict=True))
                ],
            }
        )
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False))


def _rubric_view(it: RubricItem) -> dict:
    return {
        "criteria": it.criteria,
        "criteria_valid": it.criteria is not None,
        "scores": [round(x, 4) for x in it.scores],
        "step_score": round(it.step_reward, 4),
    }


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """Epoch ``epoch``'s (0-based, over the whole run) permutation of the ``n`` training
    questions, seeded by (seed, epoch): the release shuffles its examples at every epoch start."""
    order = list(range(n))
    random.Random(f"arco-epoch:{seed}:{epoch}").shuffle(order)
    return order


def step_questions(step: int, rl, n: int, seed: int, sparse_steps: int | None = None) -> list[int]:
    """The one-rank batch of step ``step`` (1-based): indices into the ``n`` training questions,
    a function of the step alone (a resumed run draws the same questions). Each phase walks
    epochs as the release does, ceil(n / B) batches an epoch over a fresh permutation (sparse
    B = rl.sparse_questions, dense B = rl.dense_questions; the dense phase starts a new epoch).
    An epoch's last batch, short in the release, is filled up to B with the first questions of
    the same epoch's permutation: every update has B distinct questions (B <= n) and every
    epoch covers every question. ``sparse_steps``: the sparse phase's length
    (``ArcoConfig.sparse_steps``: every step under outcome-only); None: ``rl.sparse_steps``."""
    sparse = rl.sparse_steps if sparse_steps is None else sparse_steps
    sparse_epoch = -(-n // rl.sparse_questions)  # batches an epoch
    if step <= sparse:
        size, k, first = rl.sparse_questions, step - 1, 0
    else:
        size, k = rl.dense_questions, step - 1 - sparse
        first = -(-sparse // sparse_epoch)  # epochs the sparse phase began
    epoch, b = divmod(k, -(-n // size))
    order = epoch_order(n, seed, first + epoch)
    return [order[(b * size + i) % n] for i in range(size)]


def rank_step_questions(
    step: int, rl, n: int, seed: int, rank: int, world: int, sparse_steps: int | None = None
) -> list[int]:
    """Rank ``rank`` of ``world``: its contiguous slice of the one-rank batch of ``step``."""
    return rank_slice(step_questions(step, rl, n, seed, sparse_steps), rank, world)


def check_batches(rl, world: int, n: int | None = None) -> int:
    """The global batch sizes against the world size (and the ``n`` training questions); one
    line naming the key when they do not fit. Returns grad_accum: micro-batches a rank."""
    batch = rl.sparse_questions * rl.sparse_n
    if batch != rl.dense_questions:
        raise ConfigError(
            f"rl: sparse_questions*sparse_n = {batch} must equal dense_questions = "
            f"{rl.dense_questions} (one batch size for the run)"
        )
    per_rank(rl.sparse_questions, world, "rl.sparse_questions")
    rank_batch = per_rank(rl.dense_questions, world, "rl.dense_questions")
    accum = check_micro_batches(
        rank_batch, rl.micro_batch_size, "rl.dense_questions", "rl.micro_batch_size", world
    )
    for key in ("sparse_questions", "dense_questions"):
        if n is not None and getattr(rl, key) > n:
            raise ConfigError(
                f"rl.{key}={getattr(rl, key)} exceeds the {n} training questions "
                "(a batch holds each question once)"
            )
    return accum


def train_arco(cfg: ArcoConfig) -> dict:
    """Co-evolution RL from ``warmup_dir``; returns the dev evaluations (first before training)."""
    from transformers import AutoTokenizer

    rl = cfg.rl
    world = data_world_size()  # batch sizes are global: each rank's share, before any load
    check_batches(rl, world)
    cfg.check_assets(("model", "train", "dev", "retrieval", "warmup"))
    train_set = cfg.assets.questions("train", cfg.question_chars())
    dev_set = cfg.assets.questions("dev", cfg.question_chars())[: cfg.eval_questions]
    uses_mu = cfg.uses_mu
    step_scorer = cfg.reward.scorer()  # None: μ's (or none, outcome-only)
    reward_fn = cfg.reward.reward_fn()  # checked on one example before any model loads
    by_id = {q.id: q for q in train_set}
    single = mu_single_forward(cfg)
    # the keys ArcoConfig.DERIVED declares (a config or override setting them is refused)
    cfg.train.grad_accum = check_batches(rl, world, len(train_set)) * (2 if single else 1)
    cfg.train.total_steps = max(cfg.steps, 1)
    cfg.train.seed = cfg.seed
    cfg.train.lr = rl.pi_lr_sparse
    from arco.warmup_state import check_warmup_finished

    check_warmup_finished(cfg)  # its phases/mu.done, made with this run's RL settings
    if uses_mu:  # the warmup's K and rubric settings from its arco.json, before any load
        meta = read_meta(cfg.warmup_dir)
        warm = SimpleNamespace(k=int(meta["k"]), rubric_meta=meta.get("rubric"))
        check_rubric_matches(cfg, warm, cfg.warmup_dir)
    run = Run("arco", cfg)  # the run folder: lock, settings check
    try:
        if cfg.env.setting == "open":  # every rank, before any model loads
            probe_retrieval(cfg.assets.retrieval_url)
    except RunStopped:
        run.close()
        raise
    tokenizer = AutoTokenizer.from_pretrained(cfg.assets.model)
    pad_id, eos_id = padding_id(tokenizer), tokenizer.eos_token_id
    announce_plan(cfg)  # on a GPU: the memory plan, before the model loads
    model = build_arco_model(
        cfg.assets.model,
        cfg.lora.as_peft(),
        cfg.head_k,
        cfg.warmup_dir,
        dtype=cfg.train.weights_dtype(),
    )
    if uses_mu:
        check_rubric_matches(cfg, model, cfg.warmup_dir)
    if cfg.mu_frozen:
        model.freeze_rubric()
    lrs = {"policy": rl.pi_lr_sparse, "rubric": rl.mu_lr, "head": rl.head_lr}
    train = TrainEngine(model, cfg.train, param_groups=model.groups(lrs))
    retriever, agent_cfg = build_environment(
        cfg.env,
        cfg.agent,
        cfg.assets.corpus,
        cfg.assets.retrieval_url,
        cfg.assets.retrieval_max_wait_s,
    )
    engine = build_engine(
        cfg.engine, cfg.assets.model, model.lm, tokenizer, cfg.seed + train.rank, cfg.lora.r
    )
    push_adapters(engine, model)

    def dev_eval(step: int) -> dict[str, float]:
        results = dev_results_path(run.dir, step)
        rank, world = train.rank, train.world_size
        return evaluate(
            engine, tokenizer, retriever, dev_set, agent_cfg, rank, world, "policy", results
        )

    def arco_step(step: int) -> ArcoBatch:
        """π's rollouts -> μ's criteria and step scores -> sparse or dense advantages (the
        frame makes the one optimizer step on L_π + L_μ and pushes both adapters)."""
        dense = step > cfg.sparse_steps  # outcome-only: never
        late = step > cfg.pi_switch_step  # π's dense-phase lr and KL (outcome-only: ARCO's switch)
        train.set_group_lr("policy", rl.pi_lr_dense if late else rl.pi_lr_sparse)
        n = 1 if dense else rl.sparse_n
        idx = rank_step_questions(
            step, rl, len(train_set), cfg.seed, train.rank, train.world_size, cfg.sparse_steps
        )  # this rank's slice of the one-rank batch: a function of (seed, step)
        qs = [train_set[i] for i in idx]
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        trajs = step_rollouts(
            engine,
            tokenizer,
            retriever,
            qs,
            n,
            agent_cfg,
            step,
            train.rank,
            cfg.seed,
            adapter="policy",
        )
        timings["rollout"] = time.perf_counter() - t0
        ctx = RewardContext(train.model, tokenizer, engine, step, examples=by_id)
        outcome = reward_fn(groups_of(trajs), ctx)  # reward.fn: R(τ), EM by default
        rewards = outcome.values.float()
        episodes = [episode_from_trajectory(t, tokenizer, cfg.env.max_searches) for t in trajs]
        for ep, r in zip(episodes, rewards.tolist(), strict=True):
            ep.reward = r  # the reward trained on, in samples/
        items = make_rubric_items(cfg, episodes, tokenizer) if uses_mu else []
        if cfg.rubric_mode == "adaptive" and items:
            t0 = time.perf_counter()
            write_criteria(engine, items, cfg.rubric.k, cfg.rubric.max_new_tokens, eos_id)
            timings["rubric_generation"] = time.perf_counter() - t0
        if step_scorer is None:  # vLLM's last use before the push: μ scores on the training model
            run.nap()
        mu_stats: dict[str, float] = {}
        if single:  # μ's update forward gives the scores: μ's micro-steps before π's
            mu_stats = rubric_update(train, items, rewards, cfg, pad_id, timings)
        elif items:
            t0 = time.perf_counter()
            score_items(train.model, items, pad_id, rl.score_batch_size, cfg.rubric.shared_prefix)
            timings["scoring"] = time.perf_counter() - t0
        kinds = [[s.kind for s in t.steps] for t in trajs]
        scores = None  # the dense phase's s_t
        if dense:
            if step_scorer is None:
                scores = step_rewards(items, len(trajs))
            else:
                t0 = time.perf_counter()
                scores = external_step_scores(step_scorer, trajs, ctx, cfg.reward.step_scorer)
                mu_stats.update(step_scorer_metrics(step_scorer))
                timings["step_scorer"] = time.perf_counter() - t0
            step_adv = global_dense_advantages(scores, kinds, rl.c, rl.invalid_bucket, train.rank)
        else:
            a = sparse_group_advantages(rewards, [t.group_id for t in trajs]).tolist()
            step_adv = [[a[i]] * len(t.steps) for i, t in enumerate(trajs)]
        metrics = {
            "phase_dense": float(dense),
            "pi_late_schedule": float(late),
            **rollout_metrics(trajs),
            **(rubric_metrics(items, kinds, rewards, rl.invalid_bucket) if uses_mu else {}),
            "reward": rewards.mean().item(),
            **outcome.metrics,
            **identical_group_share(trajs, n),
            **(group_shares(rewards, n) if n > 1 else {}),  # sparse-shaped steps: groups
            **mu_stats,
            **arco_token_metrics(
                trajs, items, late and rl.pi_kl_coef > 0, cfg.rubric.shared_prefix
            ),
        }
        theirs = scores if step_scorer is not None else None
        return ArcoBatch(
            trajs,
            step_adv,
            rewards,
            [q.id for q in qs],
            metrics,
            lambda path: write_samples(
                path, episodes, items, step_adv, cfg.samples_per_step, theirs
            ),
            timings,
            items=items,
            late=late,
            mu_done=single,
        )

    run.begin(
        train,
        tokenizer,
        engine,
        dev_eval,
        push=lambda: push_adapters(engine, model),
        update=lambda batch: update(train, batch, cfg, pad_id),
        skipped=lambda batch: skipped_update(train, batch),
    )
    return run.fit(arco_step)
