"""A train stage's tokens through the model (the trainers' ``tokens/*`` metrics, summed over its
steps) next to ``benchmarks/cost_model.py``'s count for the same shapes (``shape/*``, step by
step), with the ratio and, where the two legitimately differ, why."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCORED_REWARDS = ("cer", "rule+cer", "verifree")  # CER's reward types that forward the scorer

NOTES = {
    "generation": "each group's prompt once (vLLM prefix caching) + every response token, as "
    "the cost model counts; from the trajectories' lengths (the engine's own prefill not read)",
    "update": "real tokens of the update's micro-batches (attention masks) vs B x G x (prompt "
    "+ response): equal by construction",
    "reference": "the reference forward (KL term), the update's rows once more",
    "padded": "positions of the padded micro-batches vs the cost model's real tokens: "
    "the ratio is the padding",
    "reward_cer": "the cost model scores every response whole after its prompt with 4 "
    "candidate answers of 6 tokens (its assumptions); the scorer forwards each solution up "
    "to its answer, skips those without one, shares the start solutions have in common, and "
    "the real candidates' count and lengths",
    "reward_none": "no model in the reward (exact match)",
    "reward_samples": "what only samples/ needed scored (0 when the reward's own scores cover "
    "the shown groups); not in the cost model",
    "rubric": "ARCO: the rubric prompts and the criteria μ wrote, every prompt whole (vLLM's "
    "prefix cache not read); arco_rows models μ for assumed trajectory shapes, not compared",
    "mu_rows": "ARCO: μ's rows (prompt + criteria) once, whole; its forwards (score, update, "
    "μ_ref) and rubric.shared_prefix's shared histories not counted; not compared",
    "mu_packed": "ARCO: the same rows as one of μ's forwards takes them (rubric.shared_prefix: "
    "each trajectory's trunk once and its rows' tails); not compared",
    "teacher": "the external teacher endpoint's usage (stand-in's count); not the policy's "
    "tokens, not compared",
}


def cost_model() -> ModuleType:
    """``benchmarks/cost_model.py`` as a module (``benchmarks`` is not a package)."""
    name = "_rehearse_cost_model"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "cost_model.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _kl(row: dict, family: str, raw: dict[str, Any]) -> float:
    """The step's KL weight to the reference: ARCO's π_kl_coef on its late steps only."""
    if family == "arco":
        late = row.get("pi_late_schedule", 0)
        return float(raw.get("rl", {}).get("pi_kl_coef", 0.0) or 0.0) if late else 0.0
    return float(raw.get("loss", {}).get("kl_coef", 0.0) or 0.0)


def _ratio(measured: float, model: float | None) -> float | None:
    if model is None:
        return None
    if model == 0:
        return 1.0 if measured == 0 else None
    return measured / model


def token_table(rows: Sequence[dict], family: str, raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per category: ``category``, ``steps``, ``measured`` (summed over ``rows``),
    ``model`` (the cost model's count for each row's shapes, summed; None where it has none),
    ``ratio`` (measured / model) and ``note``. Empty when the rows carry no ``shape/*``."""
    rows = [r for r in rows if "shape/groups" in r]
    if not rows:
        return []
    cm = cost_model()
    reward = raw.get("reward", {})
    scored = family == "cer" and reward.get("type") in SCORED_REWARDS
    batch = reward.get("scorer_batch_size") if scored else None
    model = {"generation": 0, "reward": 0, "update": 0, "reference": 0}
    for r in rows:
        shapes = cm.StepShapes.from_metrics(r)
        counts = cm.step_tokens(shapes, _kl(r, family, raw), cer_scorer_batch_size=batch)
        model = {k: model[k] + counts[k] for k in model}

    def total(key: str) -> int:
        return int(round(sum(float(r.get(key, 0) or 0) for r in rows)))

    steps = f"{rows[0]['step']}-{rows[-1]['step']}" if len(rows) > 1 else str(rows[0]["step"])
    entries = [
        ("generation", total("tokens/generation"), model["generation"], NOTES["generation"]),
    ]
    if family == "cer":
        note = NOTES["reward_cer"] if scored else NOTES["reward_none"]
        entries.append(("reward", total("tokens/reward"), model["reward"], note))
        if any("tokens/reward_samples" in r for r in rows):
            entries.append(
                ("reward (samples/)", total("tokens/reward_samples"), None, NOTES["reward_samples"])
            )
    if family == "arco":
        entries += [
            ("rubric generation (μ)", total("tokens/rubric_generation"), None, NOTES["rubric"]),
            ("μ rows", total("tokens/mu_rows"), None, NOTES["mu_rows"]),
        ]
        if any("tokens/mu_packed" in r for r in rows):
            entries.append(("μ rows packed", total("tokens/mu_packed"), None, NOTES["mu_packed"]))
    entries += [
        ("update", total("tokens/update"), model["update"], NOTES["update"]),
        ("reference", total("tokens/reference"), model["reference"], NOTES["reference"]),
    ]
    if any("tokens/update_padded" in r for r in rows):
        entries.append(
            ("update (padded)", total("tokens/update_padded"), model["update"], NOTES["padded"])
        )
    if any("teacher/tokens" in r for r in rows):
        entries.append(("teacher (external)", total("teacher/tokens"), None, NOTES["teacher"]))
    return [
        {
            "category": c,
            "steps": steps,
            "measured": m,
            "model": mod,
            "ratio": _ratio(m, mod),
            "note": n,
        }
        for c, m, mod, n in entries
    ]


def markdown_rows(stage: str, table: Sequence[dict[str, Any]]) -> list[str]:
    """``| stage | steps | category | measured | cost model | ratio | note |`` lines."""
    out = []
    for e in table:
        model = "-" if e["model"] is None else f"{e['model']:,}"
        ratio = "-" if e["ratio"] is None else f"{e['ratio']:.3f}"
        out.append(
            f"| {stage} | {e['steps']} | {e['category']} | {e['measured']:,} | {model} | "
            f"{ratio} | {e['note']} |"
        )
    return out
