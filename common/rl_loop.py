"""The building blocks of the RL loops: the engine, the clipped update, rollout metrics,
evaluation, samples and curves.

``common/run.py`` (the run frame: folder, schedule, resume, checkpoints) and the step functions
of ``common/search_grpo.py`` (the reference GRPO loop) and the method trainers (``cer``,
``eviback``, ``arco``) are built from these pieces.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from common.data import QAExample
from common.guards import agreed_nonfinite
from common.jsonl import write_jsonl_atomic
from common.metrics import exact_match, f1_score
from common.rl import (
    aggregate_loss,
    broadcast_to_tokens,
    clipped_surrogate,
    forward_logprobs,
    kl_k3,
    masked_mean,
    shared_prompt_logprobs,
)
from common.rollout import AgentConfig, HFEngine, Trajectory, run_agent
from common.rollout.batch import TokenBatch, collate
from common.run_config import EngineConfig, LossConfig, RunLoopConfig  # noqa: F401
from common.token_counts import SUMMED_PREFIXES
from common.train import TrainEngine, progress, read_metrics
from common.train.distributed import all_reduce_values, is_multi_rank


def build_engine(
    cfg: EngineConfig,
    model_path: str,
    model: torch.nn.Module | None,
    tokenizer,
    seed: int,
    lora_rank: int = 0,
):
    """HF ``generate`` on ``model`` (e.g. the trainer's own), or a colocated vLLM engine that
    loads ``model_path``; ``lora_rank`` > 0: vLLM serves two LoRA adapters of that rank on
    the one base (ARCO's policy and rubric)."""
    if cfg.backend == "hf":
        if model is None:
            raise ValueError("engine.backend=hf generates with a loaded model; none was given")
        return HFEngine(model, tokenizer, share_prompt=cfg.share_prompt)
    from common.rollout.vllm_engine import VLLMEngine

    lora = {"enable_lora": True, "max_lora_rank": max(8, lora_rank), "max_loras": 2}
    return VLLMEngine(
        model_path,
        **(lora if lora_rank else {}),
        max_model_len=cfg.max_model_len,
        kv_cache_bytes=cfg.kv_cache_mib * 2**20,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enable_sleep_mode=cfg.sleep_during_update,
        seed=seed,
        max_num_seqs=cfg.max_num_seqs or None,
        max_num_batched_tokens=cfg.max_num_batched_tokens or None,
    )


def step_rollouts(
    engine,
    tokenizer,
    retriever,
    questions: list[QAExample],
    n: int,
    agent_cfg: AgentConfig,
    step: int,
    rank: int,
    seed: int,
    **kw,
) -> list[Trajectory]:
    """A training step's rollouts (``run_agent``; ``kw`` its options): ``n`` of each question,
    group ids ``s{step}r{rank}:...`` (unique over steps and ranks) and a sampling seed that is a
    function of (seed, step)."""
    prefix, step_seed = f"s{step}r{rank}:", seed * 100003 + step
    return run_agent(
        engine, tokenizer, retriever, questions, n, agent_cfg, prefix, seed=step_seed, **kw
    )


def em_rewards(trajs: list[Trajectory]) -> torch.Tensor:
    """Binary exact match of each rollout's final answer (0 without one)."""
    return torch.tensor([exact_match(t.answer, t.golden_answers) for t in trajs])


def token_advantages(
    trajs: list[Trajectory], values: list[list[float]], loss_mask: torch.Tensor
) -> torch.Tensor:
    """Per-token advantages (``values[i]``: one per response token of ``trajs[i]``) aligned as
    ``collate`` aligns the loss mask ([B, T-1], 0 where the mask is 0)."""
    out = torch.zeros_like(loss_mask)
    for i, (t, v) in enumerate(zip(trajs, values, strict=True)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        if len(v) != r:
            raise ValueError(f"{len(v)} token advantages for {r} response tokens (sample {i})")
        if r:
            out[i, p - 1 : p + r - 1] = torch.tensor(v, dtype=out.dtype)
    return out * loss_mask


def policy_update(
    train: TrainEngine,
    trajs: list[Trajectory],
    advantages: torch.Tensor | list[list[float]],
    cfg: LossConfig,
    pad_id: int,
    rewards: torch.Tensor | None = None,
) -> dict[str, float]:
    """One optimizer step of the clipped surrogate over all ``trajs`` (on-policy: ratio starts at 1).

    ``advantages``: one per trajectory [N], or one per response token of each (a list of lists).
    The batch is cut into ``grad_accum`` equal micro-batches; each one's loss is the chosen
    aggregation, and the engine averages them. Neither the policy's nor the reference's logits
    exist whole: the head projects ``cfg.logprob_chunk`` positions at a time. A micro-batch's
    rows whose advantage is 0 throughout are left out of its forward (``trained_rows``; their
    gradient is 0) and its loss keeps the denominators of all its rows.

    ``rewards`` (optional) and ``advantages`` non-finite on any rank: the update is skipped on
    every rank before any forward (``TrainEngine.skip_update``; ``skipped_update_stats``). A
    non-finite loss or gradient norm skips the optimizer step in the engine (``TrainEngine.step``).
    """
    bad = agreed_nonfinite({"reward": rewards, "advantage": advantages})
    if bad:
        train.skip_update(bad)
        return skipped_update_stats(cfg, train) | response_length_metrics(trajs)
    return policy_step(train, trajs, advantages, cfg, pad_id)


def policy_step(
    train: TrainEngine,
    trajs: list[Trajectory],
    advantages: torch.Tensor | list[list[float]],
    cfg: LossConfig,
    pad_id: int,
) -> dict[str, float]:
    """``policy_update`` once its inputs are known finite (the run frame checks them first)."""
    mbs = cfg.micro_batch_size
    stats: dict[str, float] = {}
    tokens = {"tokens/update": 0, "tokens/update_padded": 0, "tokens/reference": 0}
    tokens["tokens/update_forwarded"] = 0  # positions run: a shared prompt counts once
    rows_run = 0
    gap = [0.0, 0.0]  # sum of |log pi_train - log pi_engine| over sampled tokens, their count
    entropy_sum = 0.0  # H of the sampled tokens' distributions, summed (count: gap[1])
    for start in range(0, len(trajs), mbs):
        part = trajs[start : start + mbs]
        part_adv = advantages[start : start + mbs]
        keep = trained_rows(part, part_adv, cfg)
        chunk = [part[i] for i in keep] if keep else [stand_in(part)]
        rows_run += len(keep)
        batch = collate(chunk, pad_id).to(train.device)
        lengths = [len(t.prompt_ids) + len(t.response_ids) for t in part]  # skipped rows in
        tokens["tokens/update"] += sum(lengths)
        tokens["tokens/update_padded"] += batch.input_ids.numel()
        if not keep:
            adv = torch.zeros_like(batch.loss_mask)
        elif isinstance(advantages, torch.Tensor):
            adv = broadcast_to_tokens(part_adv[keep].to(train.device), batch.loss_mask)
        else:
            adv = token_advantages(chunk, [part_adv[i] for i in keep], batch.loss_mask)
        entropy: list[torch.Tensor] = []
        logp, forwarded = update_logprobs(train, chunk, batch, cfg, entropy)
        tokens["tokens/update_forwarded"] += forwarded
        gap[0] += float(((logp.detach() - batch.sampling_logprobs).abs() * batch.loss_mask).sum())
        gap[1] += float(batch.loss_mask.sum())
        entropy_sum += float((entropy[0] * batch.loss_mask).sum())
        per_tok, clip = clipped_surrogate(
            logp, logp.detach(), adv, batch.loss_mask, cfg.eps_low, cfg.eps_high
        )
        norm = cfg.aggregation == "seq_mean_token_sum_norm"
        loss = aggregate_loss(  # the denominators of the whole micro-batch, skipped rows in
            per_tok,
            batch.loss_mask,
            cfg.aggregation,
            constant=max(lengths) - 1 if norm else None,
            num_seqs=len(part),
            num_tokens=float(sum(sum(t.loss_mask) for t in part)),
        )
        if cfg.kl_coef > 0:
            ref_logp = train.reference.logprobs(
                batch.input_ids, batch.attention_mask, cfg.logprob_chunk
            )  # [b, T-1]
            tokens["tokens/reference"] += int(batch.attention_mask.sum())
            kl = masked_mean(kl_k3(logp, ref_logp), batch.loss_mask)
            loss = loss + cfg.kl_coef * kl
            stats["kl"] = stats.get("kl", 0.0) + kl.item()
        train.backward(loss)
        info = train.step()
        stats["loss"] = stats.get("loss", 0.0) + loss.item()
        stats["clip_frac"] = stats.get("clip_frac", 0.0) + float(clip["clip_frac"])
    chunks = -(-len(trajs) // mbs)
    out = {k: v / chunks for k, v in stats.items()} | tokens
    out["grad_norm"] = float(info["grad_norm"]) if info["grad_norm"] is not None else float("nan")
    # over the sampled tokens forwarded; NaN when none was (every row's advantage 0)
    out["logprob_gap"] = gap[0] / gap[1] if gap[1] else float("nan")
    out["entropy"] = entropy_sum / gap[1] if gap[1] else float("nan")
    out["lr"] = float(info["lr"])  # the rate of this optimizer step
    out |= response_length_metrics(trajs)
    out["update_rows"] = rows_run  # of len(trajs): the rest had zero advantage (trained_rows)
    out["train_mode"] = float(train.model.training)  # 0: dropout and checkpointing are off
    return out


def trained_rows(
    trajs: list[Trajectory], advantages: torch.Tensor | list[list[float]], cfg: LossConfig
) -> list[int]:
    """The rows of a micro-batch its forward runs: every row, or under
    ``cfg.skip_zero_advantage`` and without a KL term those with a nonzero advantage (on some
    token). A row whose every advantage is 0 has a clipped surrogate of exactly 0 and no
    gradient. Empty when no row has one (``stand_in``)."""
    every = list(range(len(trajs)))
    if not cfg.skip_zero_advantage or cfg.kl_coef > 0:
        return every
    if isinstance(advantages, torch.Tensor):  # one read of the whole tensor (a GPU sync, not b)
        return [i for i, keep in enumerate((advantages != 0).tolist()) if keep]
    return [i for i in every if any(a != 0 for a in advantages[i])]


def stand_in(trajs: list[Trajectory]) -> Trajectory:
    """What a micro-batch without a row to train forwards: the first two tokens of its first
    row and nothing to learn (loss 0). Every micro-batch still makes a forward and a backward
    through the whole model, so every rank makes the same number: DeepSpeed counts them to the
    optimizer step, and ZeRO-3 gathers the weights in them."""
    t = trajs[0]
    ids = (t.prompt_ids + t.response_ids)[:2]
    return Trajectory(t.group_id, t.sample_index, t.question_id, t.question, t.golden_answers, ids)


def update_logprobs(
    train: TrainEngine,
    trajs: list[Trajectory],
    batch: TokenBatch,
    cfg: LossConfig,
    entropy: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, int]:
    """The micro-batch's log π [b, T-1] (``forward_logprobs``' layout) and the positions
    forwarded. With ``cfg.share_prompt`` the rows with one prompt (a GRPO group's) run it once
    (``shared_prompt_logprobs``) and the positions outside every response stay 0, which the loss
    mask leaves out; a micro-batch with a prompt under 2 tokens or no response token at all runs
    whole. ``entropy`` (a list): the entropy of each position's distribution, in the same
    layout and without gradient, is appended to it (from the same forward's head chunks)."""
    whole = int(batch.attention_mask.sum())
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(trajs):
        by_prompt.setdefault(tuple(t.prompt_ids), []).append(i)
    if (
        not cfg.share_prompt
        or min(len(p) for p in by_prompt) < 2
        or not any(t.response_ids for t in trajs)
    ):
        logp = forward_logprobs(
            train, batch.input_ids, batch.attention_mask, cfg.logprob_chunk, entropy=entropy
        )
        return logp, whole
    rows, cols, values, entropies, forwarded = [], [], [], [], 0
    for prompt, idx in by_prompt.items():
        p, r = len(prompt), max(len(trajs[i].response_ids) for i in idx)
        if r == 0:
            continue
        index = torch.tensor(idx, device=batch.input_ids.device)
        response = batch.input_ids[index, p : p + r]  # right-padded by collate
        mask = batch.attention_mask[index, p : p + r]
        sink: list[torch.Tensor] = []
        prompt_ids = batch.input_ids[idx[0], :p]
        got = shared_prompt_logprobs(
            train, prompt_ids, response, mask, cfg.logprob_chunk, entropy=sink
        )
        values.append(got.reshape(-1))
        entropies.append(sink[-1].reshape(-1))
        rows.append(index.repeat_interleave(r))
        cols.append(torch.arange(p - 1, p - 1 + r, device=index.device).repeat(len(idx)))
        forwarded += p + int(mask.sum())
    b, width = batch.input_ids.shape
    logp = torch.zeros(b, width - 1, device=values[0].device, dtype=values[0].dtype)
    where = (torch.cat(rows), torch.cat(cols))
    if entropy is not None:
        entropy.append(torch.zeros_like(logp).index_put(where, torch.cat(entropies)))
    return logp.index_put(where, torch.cat(values)), forwarded


def skipped_update_stats(cfg: LossConfig, train: TrainEngine) -> dict[str, float]:
    """``policy_update``'s statistics for an update skipped before its first micro-batch: the
    same keys, nothing measured (NaN) and no token through the model."""
    nan = float("nan")
    out = {"loss": nan, "clip_frac": nan} | ({"kl": nan} if cfg.kl_coef > 0 else {})
    out |= {"tokens/update": 0, "tokens/update_padded": 0, "tokens/reference": 0}
    out |= {"tokens/update_forwarded": 0, "update_rows": 0}
    out |= {"entropy": nan, "lr": float(train.lr)}
    return out | {"grad_norm": nan, "logprob_gap": nan, "train_mode": float(train.model.training)}


def response_length_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``response_length/mean`` and ``/max`` (verl's names; TRL's ``completions/mean_length``)
    over ``trajs``: every response token, a search agent's inserted documents included
    (``len(response_ids)``); ``all_ranks_mean`` takes the max over ranks (``MAX_OVER_RANKS``)."""
    lengths = [len(t.response_ids) for t in trajs]
    return {
        "response_length/mean": sum(lengths) / max(len(lengths), 1),
        "response_length/max": float(max(lengths, default=0)),
    }


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    n = max(len(trajs), 1)
    searches = sum(t.num_searches for t in trajs)
    return {
        "em": sum(exact_match(t.answer, t.golden_answers) for t in trajs) / n,
        "f1": sum(f1_score(t.answer, t.golden_answers) for t in trajs) / n,
        "valid_answer_rate": sum(t.answer is not None for t in trajs) / n,
        "mean_searches": searches / n,
        "duplicate_query_rate": sum(t.num_duplicate_queries for t in trajs) / max(searches, 1),
        "forced_termination_rate": sum(t.forced_terminated for t in trajs) / n,
        "invalid_turns": sum(t.num_invalid for t in trajs) / n,
        "response_tokens": sum(len(t.response_ids) for t in trajs) / n,
    }


def identical_group_share(trajs: list[Trajectory], n: int) -> dict[str, float]:
    """The share of groups (``n`` consecutive rollouts of one question, ``n`` > 1) whose
    rollouts are token for token the same (nothing for ``n`` = 1): 1.0 when every request of a group samples from one
    seed (GPU vLLM honours request seeds), and then no group has an advantage to learn from."""
    if n < 2:
        return {}  # one rollout a question: no group to compare
    if len(trajs) % n:
        raise ValueError(f"identical_group_share: {len(trajs)} rollouts in groups of {n}")
    groups = [trajs[g : g + n] for g in range(0, len(trajs), n)]
    same = sum(all(t.response_ids == g[0].response_ids for t in g) for g in groups)
    return {"identical_group_share": same / len(groups)}


def group_shares(rewards: torch.Tensor, n: int) -> dict[str, float]:
    """The share of groups (``n`` consecutive rollouts of one question) with no rollout
    rewarded (``all_zero_share``: no outcome signal for GRPO) and with rewards that differ
    (``mixed_group_share``: a nonzero group-normalized advantage)."""
    groups = rewards.float().view(-1, n)
    best, worst = groups.max(1).values, groups.min(1).values
    return {
        "all_zero_share": (best <= 0).float().mean().item(),
        "mixed_group_share": (best > worst).float().mean().item(),
    }


# NaN on a rank that measured nothing (``logprob_gap``, ``entropy``: no sampled token forwarded)
MEASURED_WHERE_FINITE = frozenset({"logprob_gap", "entropy"})
# The largest over ranks, not a mean (``response_length_metrics``)
MAX_OVER_RANKS = frozenset({"response_length/max"})


def all_ranks_mean(metrics: dict[str, float], weight: int) -> dict[str, float]:
    """Each metric averaged over ranks, rank r weighted by its ``weight`` (e.g. its sample count);
    counts (``tokens/*``, ``shape/*``: ``common.token_counts``) summed over ranks. A metric of
    ``MEASURED_WHERE_FINITE`` is averaged over the ranks where it is finite (NaN if none): one
    rank whose rows all had zero advantage does not make the step's ``logprob_gap`` NaN. A
    metric of ``MAX_OVER_RANKS`` is the largest over ranks (a second collective)."""
    if not is_multi_rank():
        return metrics
    keys = sorted(metrics)
    summed = [k.startswith(SUMMED_PREFIXES) for k in keys]
    weights = [
        0.0 if k in MEASURED_WHERE_FINITE and not math.isfinite(metrics[k]) else float(weight)
        for k in keys
    ]
    values = [
        metrics[k] if s else (metrics[k] * w if w else 0.0)  # NaN * 0 would be NaN
        for k, s, w in zip(keys, summed, weights, strict=True)
    ]
    t = all_reduce_values(values + weights)
    n = len(keys)
    out = {
        k: t[i] if summed[i] else (t[i] / t[n + i] if t[n + i] else math.nan)
        for i, k in enumerate(keys)
    }
    maxed = [k for k in keys if k in MAX_OVER_RANKS]
    if maxed:  # the same keys on every rank: every rank makes this collective or none does
        out |= dict(zip(maxed, all_reduce_values([metrics[k] for k in maxed], "max"), strict=True))
    return out


def result_line(out: dict) -> str:
    """A trainer's summary: ``dev EM 0.100 -> 0.200, F1 ...; run_dir``, or that it had no dev
    evaluation (``eval_every=0``)."""
    b, a = out["before"], out["after"]
    if b is None:
        return f"no dev evaluation (eval_every=0); {out['run_dir']}"
    return (
        f"dev EM {b['em']:.3f} -> {a['em']:.3f}, F1 {b['f1']:.3f} -> {a['f1']:.3f}; "
        f"{out['run_dir']}"
    )


def evaluate(
    engine,
    tokenizer,
    retriever,
    examples: list[QAExample],
    agent: AgentConfig,
    rank: int = 0,
    world: int = 1,
    adapter: str | None = None,
    results_path: Path | None = None,
    desc: str | None = "eval",
) -> dict[str, float]:
    """Greedy single-sample EM/F1 and behaviour metrics on this rank's shard, averaged over ranks
    (``adapter``: the engine's LoRA adapter that plays the policy). With ``results_path`` the
    main rank writes one row per question (``question_rows``), every rank's shard gathered, in
    the order of ``examples``: what ``experiments.compare`` pairs across runs. ``desc``: the
    progress bar's name (rank 0's shard; ``agent_rollouts``); None: no bar."""
    shard = examples[rank::world]
    greedy = AgentConfig(**{**vars(agent), "temperature": 0.0, "top_p": 1.0, "top_k": 0})
    trajs = agent_rollouts(
        engine, tokenizer, retriever, shard, 1, greedy, desc, group_prefix="eval:", adapter=adapter
    )
    if results_path is not None:
        rows = gather_in_order(question_rows(trajs), world)
        if rank == 0:
            write_jsonl_atomic(results_path, rows)
    return all_ranks_mean(rollout_metrics(trajs), len(shard))


def agent_rollouts(
    engine,
    tokenizer,
    retriever,
    examples: list[QAExample],
    n: int,
    agent: AgentConfig,
    desc: str | None,
    **kwargs,
) -> list[Trajectory]:
    """``run_agent`` (``kwargs``: its own) with a bar of the questions done on stderr
    (``common.train.progress``: count, total, questions a second; rank 0), advanced as each
    question's ``n`` rollouts finish. ``desc`` None: no bar. The rollouts are ``run_agent``'s."""
    if desc is None:
        return run_agent(engine, tokenizer, retriever, examples, n, agent, **kwargs)
    with progress(None, desc, total=len(examples), unit="question") as bar:

        def done(group: list[Trajectory]) -> None:
            bar.update(1)

        return run_agent(
            engine, tokenizer, retriever, examples, n, agent, on_group_done=done, **kwargs
        )


def question_rows(trajs: list[Trajectory]) -> list[dict]:
    """One greedy trajectory per question as ``{id, em, f1, valid, searches, forced, answer}``."""
    return [
        {
            "id": t.question_id,
            "em": exact_match(t.answer, t.golden_answers),
            "f1": f1_score(t.answer, t.golden_answers),
            "valid": t.answer is not None,
            "searches": t.num_searches,
            "forced": t.forced_terminated,
            "answer": t.answer,
        }
        for t in trajs
    ]


def gather_in_order(rows: list, world: int) -> list:
    """Every rank's rows of ``items[rank::world]``, back in the order of ``items``."""
    if world == 1:
        return rows
    shards: list[list | None] = [None] * world
    torch.distributed.all_gather_object(shards, rows)
    total = sum(len(s) for s in shards)
    return [shards[i % world][i // world] for i in range(total)]


def dev_results_path(run_dir: Path, step: int) -> Path:
    """Where a run's per-question dev results at ``step`` go."""
    return run_dir / "dev_results" / f"step_{step:05d}.jsonl"


def held_out_results_path(run_dir: Path, step: int) -> Path:
    """Where a run's per-question results on its held-out test split at ``step`` go (the start
    and the final policy: ``experiments.compare`` reports them beside dev)."""
    return run_dir / "test_results" / f"step_{step:05d}.jsonl"


def logged_evals(path: Path, before: int) -> list[dict]:
    """Evaluations (``dev/*`` rows, prefix dropped) an earlier, interrupted start of the run
    logged before step ``before``: a resumed run's curve and result keep them."""
    if not path.exists():
        return []
    rows = [r for r in read_metrics(path) if r["step"] < before and any(map(is_dev, r))]
    return [
        {"step": r["step"], **{k[4:]: v for k, v in r.items() if k.startswith("dev/")}}
        for r in rows
    ]


def is_dev(key: str) -> bool:
    return key.startswith("dev/")


def write_samples(path: Path, trajs: list[Trajectory], rewards: torch.Tensor, tokenizer) -> None:
    rows = [{"reward": rewards[i].item(), **t.to_json(tokenizer)} for i, t in enumerate(trajs)]
    for row in rows:  # ids are in the trajectory record; the sample file is for reading
        for key in ("prompt_ids", "response_ids", "loss_mask", "sampling_logprobs"):
            row.pop(key)
    path.write_text(json.dumps(rows, indent=1, ensure_ascii=False))


SEARCH_CURVES = (("em", "dev EM"), ("f1", "dev F1"))


def plot_curve(
    evals: list[dict],
    path: Path,
    curves: tuple[tuple[str, str], ...] = SEARCH_CURVES,
    xlabel: str = "GRPO step",
) -> Path:
    """The dev evaluations' ``curves`` ((key, label) pairs; a search agent's EM and F1 by
    default) against RL step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    steps = [e["step"] for e in evals]
    for (key, label), marker in zip(curves, "os^v", strict=False):
        ax.plot(steps, [e[key] for e in evals], marker=marker, label=label)
    ax.set_xlabel(xlabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
