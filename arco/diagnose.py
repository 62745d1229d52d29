"""Rubric diagnostics, ``python -m arco diagnose`` (docs/arco_internals.md, "Warmups, fixed
criteria, μ outside the trainer, diagnose"):

- **Action identification**: for a step whose question has other rollouts, the candidates are
  the distinct actions taken at the same step by the question's rollouts; μ's criteria for the
  real action are scored under the rubric prompt of each candidate (the same prefix, the action
  swapped), and the candidate under which μ gives the criteria the highest likelihood is its
  pick. Accuracy against chance (the mean of 1 / #candidates); ties count as a share.
- **Score distributions**: the step scores s_t by position bucket, for correct (R = 1) and wrong
  trajectories, as a markdown table and a box plot.

Writes ``diagnose.md``, ``diagnose.json`` and ``score_distributions.png``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from arco.advantages import position_buckets
from arco.rubrics import RubricItem, compute_dtype, rubric_batch, trajectory_chunks, trunk_batch
from arco.steps import Episode
from common.rl import logprobs_from_logits
from common.rollout.batch import padding_id
from common.train.distributed import refuse_ranks


@dataclass
class IdentificationCase:
    """One step's test: μ's criteria for the real action, the candidate actions (sorted), and
    which candidate is the real one."""

    episode: int
    step: int
    candidates: list[str]
    truth: int


def identification_cases(
    episodes: Sequence[Episode], max_candidates: int
) -> list[IdentificationCase]:
    """For every step of every episode: the distinct actions the same question's episodes took at
    that step (the real one always included, at most ``max_candidates``), sorted by text so the
    real action's place carries no information. Steps with fewer than two candidates are left
    out."""
    by_question: dict[str, list[int]] = {}
    for i, ep in enumerate(episodes):
        by_question.setdefault(ep.question_id, []).append(i)
    cases = []
    for i, ep in enumerate(episodes):
        for t, step in enumerate(ep.steps):
            others = []
            for j in by_question[ep.question_id]:
                other = episodes[j].steps
                if t < len(other) and other[t].action not in others + [step.action]:
                    others.append(other[t].action)
            if not others:
                continue
            candidates = sorted([step.action, *others[: max_candidates - 1]])
            cases.append(IdentificationCase(i, t, candidates, candidates.index(step.action)))
    return cases


def pick_share(logliks: Sequence[float], truth: int) -> float:
    """1 / #ties when the real candidate has the highest likelihood (shared with #ties), else 0."""
    best = max(logliks)
    tied = [i for i, v in enumerate(logliks) if v == best]
    return 1.0 / len(tied) if truth in tied else 0.0


@torch.no_grad()
def criteria_loglik(
    model, items: Sequence[RubricItem], pad_id: int, batch_size: int, shared: bool = False
) -> list:
    """Σ log μ(criteria tokens | rubric prompt) under the rubric adapter, one value per item.
    ``shared``: the items of one ``traj`` value (here: one case's candidates, which share the
    prompt up to the action) forwarded as one trunk (``trunk_batch``)."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[float] = []
    try:
        if shared:
            values = [0.0] * len(items)
            for where in trajectory_chunks(items, batch_size):
                chunk = [items[i] for i in where]
                tb = trunk_batch(chunk, pad_id, device, compute_dtype(model))
                logits, _ = model(
                    "rubric", tb.ids, tb.mask, logit_mask=tb.logit_mask, position_ids=tb.positions
                )  # [n, V]: each needed packed position once
                logp = logprobs_from_logits(logits[tb.crit_at], tb.crit_target)  # [C]
                total = logp.new_zeros(len(chunk)).index_add(0, tb.crit_item, logp)
                for i, v in zip(where, total.tolist(), strict=True):
                    values[i] = v
            return values
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            ids, attn, crit = rubric_batch(chunk, pad_id, device)
            # the head at the criteria positions alone: [n, V], no [B, T, V] logits
            at = torch.nn.functional.pad(crit, (0, 1)).bool()  # position t predicts t + 1
            logits, _ = model("rubric", ids, attn, logit_mask=at)
            logp = torch.zeros_like(crit)
            logp[crit.bool()] = logprobs_from_logits(logits, ids[:, 1:][crit.bool()])
            out.extend(logp.sum(-1).tolist())
    finally:
        model.train(was_training)
    return out


def action_identification(
    model,
    episodes: Sequence[Episode],
    items: Sequence[RubricItem],
    make_items,
    pad_id: int,
    max_candidates: int = 4,
    batch_size: int = 32,
    shared: bool = False,
) -> dict:
    """Accuracy of picking the real action from μ's criteria (``items``: one per step of
    ``episodes``, trajectory-major, with the criteria μ wrote). ``make_items(episodes)`` builds
    rubric items for episodes as the run does (mode, prefix, K, templates). ``shared``: a case's
    candidates forwarded as one trunk (``criteria_loglik``)."""
    by_step = {(it.traj, it.step): it for it in items}
    cases = identification_cases(episodes, max_candidates)
    variants: list[Episode] = []
    where: list[tuple[int, int]] = []  # (case, candidate)
    for c, case in enumerate(cases):
        ep = episodes[case.episode]
        for k, action in enumerate(case.candidates):
            steps = list(ep.steps[: case.step + 1])
            steps[case.step] = replace(steps[case.step], action=action)
            variants.append(replace(ep, steps=steps))
            where.append((c, k))
    last = {it.traj: it for it in make_items(variants)}  # the swapped step: each variant's last
    probe = []
    for v, (c, _) in enumerate(where):
        real = by_step[(cases[c].episode, cases[c].step)]
        # traj = the case: one case's candidates are one group of the shared path
        probe.append(RubricItem(c, last[v].step, last[v].prompt_ids, list(real.criteria_ids)))
    logliks = criteria_loglik(model, probe, pad_id, batch_size, shared)
    per_case: list[list[float]] = [[] for _ in cases]
    for (c, _), value in zip(where, logliks, strict=True):
        per_case[c].append(value)
    shares = [pick_share(v, case.truth) for v, case in zip(per_case, cases, strict=True)]
    chance = [1.0 / len(case.candidates) for case in cases]
    n = len(cases)
    return {
        "cases": n,
        "accuracy": statistics.fmean(shares) if n else float("nan"),
        "chance": statistics.fmean(chance) if n else float("nan"),
        "mean_candidates": statistics.fmean(len(c.candidates) for c in cases) if n else 0.0,
    }


def score_distributions(
    episodes: Sequence[Episode], items: Sequence[RubricItem], invalid_bucket: bool = True
) -> dict[str, dict[str, list[float]]]:
    """``{bucket: {"correct": [s_t ...], "wrong": [...]}}`` over every step of ``episodes``."""
    by_step = {(it.traj, it.step): it.step_reward for it in items}
    out: dict[str, dict[str, list[float]]] = {}
    for i, ep in enumerate(episodes):
        side = "correct" if ep.reward > 0.5 else "wrong"
        buckets = position_buckets([s.kind for s in ep.steps], invalid_bucket)
        for t, b in enumerate(buckets):
            out.setdefault(b, {"correct": [], "wrong": []})[side].append(by_step[(i, t)])
    return dict(sorted(out.items(), key=lambda kv: _bucket_order(kv[0])))


def _bucket_order(name: str) -> tuple[int, int]:
    if name.startswith("search_"):
        return (0, int(name.split("_")[1]))
    return (1, 0) if name == "invalid" else (2, 0)


def _stats(values: Sequence[float]) -> str:
    if not values:
        return "0 | – | –"
    sd = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{len(values)} | {statistics.fmean(values):+.3f} | {sd:.3f}"


def markdown(summary: dict) -> str:
    ident = summary["identification"]
    lines = [f"Checkpoint `{summary['checkpoint']}`; {summary['trajectories']} trajectories."]
    if ident is None:
        lines.append("\nAction identification: n/a (rubric mode without μ-written criteria).")
    else:
        lines.append(
            f"\nAction identification: {ident['accuracy']:.3f} over {ident['cases']} steps "
            f"(chance {ident['chance']:.3f}, {ident['mean_candidates']:.2f} candidates a step)."
        )
    lines += [
        "",
        "| bucket | correct n | correct mean s_t | correct sd | wrong n | wrong mean s_t | wrong sd |",
        "|---|---|---|---|---|---|---|",
    ]
    for b, sides in summary["scores"].items():
        lines.append(f"| {b} | {_stats(sides['correct'])} | {_stats(sides['wrong'])} |")
    return "\n".join(lines) + "\n"


def plot(scores: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """Box plots of s_t per bucket, correct and wrong trajectories side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(scores) + 1), 3.5))
    for offset, side, color in ((-0.18, "correct", "tab:green"), (0.18, "wrong", "tab:red")):
        data = [scores[b][side] or [float("nan")] for b in scores]
        pos = [i + offset for i in range(len(scores))]
        box = ax.boxplot(data, positions=pos, widths=0.3, patch_artist=True, showfliers=False)
        for patch in box["boxes"]:
            patch.set_facecolor(color)
            patch.set_alpha(0.5)
        ax.plot([], [], color=color, lw=6, alpha=0.5, label=side)
    ax.set_xticks(range(len(scores)), list(scores))
    ax.set_ylabel("step score s_t")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def default_checkpoint(cfg) -> Path:
    """The run's latest checkpoint, else the warmup's output."""
    from common.train import find_latest_checkpoint

    latest = find_latest_checkpoint(Path(cfg.run_dir))
    return Path(latest) if latest is not None else Path(cfg.warmup_dir)


def run_diagnose(cfg, checkpoint: str | None = None) -> dict:
    """Roll out the checkpoint's policy on dev questions (``diagnose.samples`` each, sampled),
    write μ's rubrics for every step, and report action identification and score distributions.
    A checkpoint of ``run_dir`` also gets the accuracy logged into the run's metrics.jsonl at its
    step (``diag/action_id_accuracy``, ``diag/action_id_chance``), where comparisons read it."""
    refuse_ranks("arco diagnose", "its rollouts and μ's scoring are not split over ranks")
    from arco.environment import build_environment
    from arco.rubric_model import read_meta
    from arco.rubrics import score_items, write_criteria
    from arco.steps import episode_from_trajectory
    from arco.trainer import load_arco_folder, make_rubric_items, push_adapters
    from common.rl_loop import build_engine
    from common.rollout import run_agent
    from common.train import MetricsLogger

    d = cfg.diagnose
    cfg.check_assets(("model", "dev", "retrieval"))
    folder = Path(checkpoint) if checkpoint else default_checkpoint(cfg)
    read_meta(folder)  # a clear error when it is not an ARCO folder
    model, tokenizer = load_arco_folder(cfg, folder)
    pad_id, eos_id = padding_id(tokenizer), tokenizer.eos_token_id
    retriever, agent_cfg = build_environment(
        cfg.env,
        cfg.agent,
        cfg.assets.corpus,
        cfg.assets.retrieval_url,
        cfg.assets.retrieval_max_wait_s,
    )
    engine = build_engine(cfg.engine, cfg.assets.model, model.lm, tokenizer, cfg.seed, cfg.lora.r)
    push_adapters(engine, model)
    questions = cfg.assets.questions("dev", cfg.question_chars())[: d.questions]
    play = replace(agent_cfg, temperature=d.temperature)
    trajs = run_agent(
        engine,
        tokenizer,
        retriever,
        questions,
        d.samples,
        play,
        group_prefix="diagnose:",
        adapter="policy",
        seed=cfg.seed,
    )
    episodes = [episode_from_trajectory(t, tokenizer, cfg.env.max_searches) for t in trajs]
    items = make_rubric_items(cfg, episodes, tokenizer)
    if cfg.rubric_mode == "adaptive":
        write_criteria(engine, items, cfg.rubric.k, cfg.rubric.max_new_tokens, eos_id)
    score_items(model, items, pad_id, cfg.rl.score_batch_size, cfg.rubric.shared_prefix)
    ident = None
    if cfg.rubric_mode == "adaptive":  # fixed criteria or none: nothing μ wrote for an action
        ident = action_identification(
            model,
            episodes,
            items,
            lambda eps: make_rubric_items(cfg, eps, tokenizer),
            pad_id,
            d.max_candidates,
            cfg.rl.score_batch_size,
            cfg.rubric.shared_prefix,
        )
    scores = score_distributions(episodes, items, cfg.rl.invalid_bucket)
    summary = {
        "checkpoint": str(folder),
        "trajectories": len(episodes),
        "mean_reward": statistics.fmean(ep.reward for ep in episodes) if episodes else 0.0,
        "identification": ident,
        "scores": scores,
    }
    out = Path(d.out) if d.out else folder / "diagnose"
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(summary)
    (out / "diagnose.md").write_text(text, encoding="utf-8")
    (out / "diagnose.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    plot(scores, out / "score_distributions.png")
    step = _checkpoint_step(folder, Path(cfg.run_dir))
    if ident is not None and step is not None:
        logger = MetricsLogger(cfg.run_dir)
        logger.log(
            step,
            {
                "diag/action_id_accuracy": ident["accuracy"],
                "diag/action_id_chance": ident["chance"],
            },
        )
        logger.close()
    return {**summary, "out": str(out), "table": text}


def _checkpoint_step(folder: Path, run_dir: Path) -> int | None:
    """N for ``run_dir/checkpoints/step_N``, else None (a warmup or a foreign folder)."""
    if folder.resolve().parent != (run_dir / "checkpoints").resolve():
        return None
    name = folder.name
    return int(name.split("_")[1]) if name.startswith("step_") else None
