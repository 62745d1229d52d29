"""``make gpu-check``: the GPU-only behaviour of every method, checked in minutes on one GPU.

For one paper config a method (``CHECKS``), the rehearsal (``experiments.rehearse``: a shrunken
stand-in of the config's model with its real tokenizer, stand-in data, retrieval and endpoints,
nothing from the network) runs the stages up to training, 2 training steps, on the GPU. From each
run's ``metrics.jsonl`` it then checks what only a GPU shows:

- ``train_mode``: the model trains in training mode (HF checkpoints a layer only then);
- ``logprob_gap``: mean |log pi_train - log pi_engine| over sampled tokens (a bf16 rotary buffer
  or another model in the engine shows here);
- ``identical_group_share``: the share of groups whose rollouts are token-identical (GPU vLLM
  honours request seeds: one seed a group makes them all the same);
- ``memory/*``: each phase's peak (torch's allocator, a sleeping vLLM's pool left out: its
  tensors stay counted by the allocator though their pages are freed) and the device's most use
  seen in it (``common.train.gpu_memory``), both under the device's capacity, and next to the
  memory plan (``common.train.memory_plan``) of the stand-in at the config's settings (reported,
  not judged: the plan is at the longest lengths).

One pass/fail line each; exit status 0 when all pass, 1 when one fails, 2 when it cannot run
(no CUDA device). Nothing here has run on a GPU until this has passed on one.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
# one paper config a method, and the rehearsal's stages that its training needs
CHECKS: dict[str, tuple[str, ...]] = {
    "eviback/configs/qwen3_0.6b.yaml": ("ape", "train"),
    "cer/configs/qwen3_4b_base_math.yaml": ("train",),
    "arco/configs/qwen3_4b_hotpotqa.yaml": ("warmup", "train"),
}
# A train-vs-engine gap above this is another model or other positions, not bf16 rounding
# (verl's rollout-vs-actor gap in bf16 is a few hundredths).
GAP_LIMIT = 0.1
# One seed for a group's requests makes every group tie at every step (share 1.0). The stand-in's
# scripted chain is nearly deterministic, so some of its few groups tie by chance (measured on
# CPU, where vLLM drops request seeds: ARCO's sparse step 0.5, EviBack's and CER's 0.0).
IDENTICAL_LIMIT = 1.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self, config: str) -> str:
        return f"[gpu-check] {'PASS' if self.ok else 'FAIL'} {config}: {self.name}: {self.detail}"


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the rows that measured it (NaN: an update that forwarded no
    sampled token, all its advantages 0, or a skipped one)."""
    values = [float(r[key]) for r in rows if key in r and math.isfinite(float(r[key]))]
    return sum(values) / len(values) if values else None


def _max(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r]
    return max(values) if values else None


def step_checks(rows: list[dict[str, Any]], capacity_gib: float | None) -> list[Check]:
    """The checks on a run's training rows (``metrics.jsonl`` rows with a ``loss``); pure."""
    if not rows:
        return [Check("training steps", False, "metrics.jsonl has no training step")]
    checks = [Check("training steps", True, f"{len(rows)} logged")]
    modes = [r["train_mode"] for r in rows if "train_mode" in r]
    checks.append(
        Check(
            "model.training",
            bool(modes) and all(m == 1 for m in modes),
            f"train_mode {modes}" if modes else "train_mode was not logged",
        )
    )
    gap = _mean(rows, "logprob_gap")
    checks.append(
        Check(
            "train-vs-engine log-prob gap",
            gap is not None and gap <= GAP_LIMIT,
            "not logged" if gap is None else f"mean {gap:.4f} (limit {GAP_LIMIT})",
        )
    )
    same = _mean(rows, "identical_group_share")
    checks.append(
        Check(
            "identical-rollout share",
            same is not None and same < IDENTICAL_LIMIT,
            "not logged" if same is None else f"mean {same:.3f} (fails at {IDENTICAL_LIMIT})",
        )
    )
    phases = sorted(
        {k.split("/")[1].rsplit("_", 2)[0] for r in rows for k in r if k.startswith("memory/")}
    )
    if not phases:
        checks.append(Check("memory by phase", False, "no memory/* metric (not on a GPU?)"))
        return checks
    parts, worst = [], 0.0
    # both mean what the plan's phase peak means: the device's, a sleeping vLLM's share not in it
    for phase in phases:
        peak = _max(rows, f"memory/{phase}_peak_gib") or 0.0
        device = _max(rows, f"memory/{phase}_device_gib") or 0.0
        worst = max(worst, device, peak)
        parts.append(f"{phase} peak {peak:.2f} GiB, device {device:.2f} GiB")
    fits = capacity_gib is None or worst <= capacity_gib
    cap = f" of {capacity_gib:.0f} GiB" if capacity_gib else ""
    checks.append(Check("memory by phase", fits, "; ".join(parts) + cap))
    return checks


def stand_in_plan(config: str, model_dir: Path, capacity_gib: float) -> tuple[str, float | None]:
    """The memory plan of the stand-in at the config's settings on one rank of this GPU: its
    table, and the planned peak a rank (GiB; None when the plan cannot be made)."""
    from common.train.memory_plan import plan_for_config

    try:
        plan = plan_for_config(
            ROOT / config, 1, {"this GPU": capacity_gib}, [f"assets.model={model_dir}"]
        )
    except Exception as err:  # noqa: BLE001 -- the plan is reported, never a reason to stop
        return f"(no memory plan: {type(err).__name__}: {err})", None
    return plan.format(), plan.gpus[0].peak / 2**30


def _training_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    # a torn last line of an interrupted run is dropped (common.jsonl.read_jsonl)
    return [r for r in read_jsonl(path, key="step") if "loss" in r or "loss_pi" in r]


def _capacity_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def check_config(config: str, stages: tuple[str, ...], out: Path) -> list[Check]:
    """Rehearse ``config``'s ``stages`` (2 training steps) here and check its training rows."""
    from experiments.rehearse.runner import family, rehearsal_name, rehearse

    folder = out / rehearsal_name(config, None)
    shutil.rmtree(folder, ignore_errors=True)
    report = rehearse(config, None, 1, folder, None, list(stages))
    checks = [
        Check(
            f"stage {r.name}",
            r.ok,
            f"{r.seconds:.0f} s" if r.ok else f"{r.error} (log: {folder}/logs/{r.name}.log)",
        )
        for r in report.stages
    ]
    if not report.ok:
        return checks
    capacity = _capacity_gib()
    rows = _training_rows(folder / "runs" / family(config))
    checks += step_checks(rows, capacity)
    if capacity is not None:
        table, planned = stand_in_plan(config, folder / "model", capacity)
        (folder / "memory_plan.md").write_text(table + "\n", encoding="utf-8")
        measured = max(
            (v for r in rows for k, v in r.items() if k.endswith("_peak_gib")), default=None
        )
        detail = (
            f"planned peak {planned:.2f} GiB a rank, measured (torch's allocator, a sleeping "
            "vLLM's pool left out) "
            f"{measured if measured is None else round(measured, 2)} GiB; table: "
            f"{folder / 'memory_plan.md'}"
            if planned is not None
            else table
        )
        checks.append(Check("memory against the plan", True, detail))
    return checks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__)
    p.add_argument("--out", default=str(ROOT / "runs" / "gpu-check"), help="output folder")
    p.add_argument("--config", action="append", help="only these of the checked configs")
    p.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run on a machine without CUDA too (the memory checks then fail: for trying it out)",
    )
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print(
            "[gpu-check] no CUDA device here (torch.cuda.is_available() is False): run it on a "
            "GPU machine; on a CPU the paper configs are rehearsed by `make rehearse`",
            file=sys.stderr,
        )
        return 2
    unknown = sorted(set(args.config or ()) - set(CHECKS))
    if unknown:
        print(
            f"[gpu-check] unknown config(s) {unknown}; checked: {sorted(CHECKS)}", file=sys.stderr
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    lines = []
    for config, stages in CHECKS.items():
        if args.config and config not in args.config:
            continue
        for check in check_config(config, stages, out):
            lines.append(check.line(config))
            print(lines[-1], flush=True)
    failed = sum(" FAIL " in line for line in lines)
    summary = f"[gpu-check] {len(lines) - failed} passed, {failed} failed in {time.perf_counter() - t0:.0f} s"
    print(summary)
    (out / "gpu_check.txt").write_text("\n".join([*lines, summary]) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
