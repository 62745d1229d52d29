"""Where a step of the reference GRPO loop goes, and the weight push against the step.

Runs ``train_grpo`` (``common/configs/grpo_tiny.yaml``: 8 questions x 8 multi-turn rollouts,
vLLM engine, BM25 retrieval, micro-batches of 32) for ``--steps`` steps in a temporary run
folder, or reads an existing run's ``metrics.jsonl`` (``--metrics``), and tabulates the
``time/*`` keys the loop logs: generation and retrieval (inside ``run_agent``), update (the
training forward that computes the token logprobs, backward and optimizer step: on-policy, the
old logprobs are the sampling ones, so there is no separate logprob pass), push (weights into
the engine and prefix-cache reset) and the rest (rewards, advantages, bookkeeping). The first
step (warm-up) is dropped; medians over the rest.

    .venv/bin/python benchmarks/bench_grpo_breakdown.py [--steps 8] [--write-readme]
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench_result import Check, write_result
from rl_bench_common import (
    ROOT,
    command_line,
    load_average,
    machine_note,
    md_table,
    update_readme,
)

PARTS = ("generation", "retrieval", "update", "push")


def read_steps(path: Path) -> list[dict]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not JSON ({e})") from None
        if "time/step" in row:
            rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no row with a time/step key (is it a search_grpo run?)")
    return rows


def run_loop(steps: int, overrides: list[str]) -> Path:
    from common.config import load_config
    from common.search_grpo import GRPOConfig, train_grpo

    run_dir = Path(tempfile.mkdtemp(prefix="grpo-breakdown-"))
    cfg = load_config(
        GRPOConfig,
        str(ROOT / "common/configs/grpo_tiny.yaml"),
        [
            f"steps={steps}",
            f"eval_every={steps}",
            "eval_questions=8",
            f"run_dir={run_dir}",
            *overrides,
        ],  # fmt: skip
    )
    for name in ("world", "model"):  # the config's paths are relative to the repository root
        value = getattr(cfg.assets, name)
        if value and not Path(value).is_absolute():
            setattr(cfg.assets, name, str(ROOT / value))
    train_grpo(cfg)
    return run_dir / "metrics.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--metrics", default="", help="read this metrics.jsonl instead of running")
    parser.add_argument("overrides", nargs="*", help="extra config overrides, key=value")
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()
    load0 = load_average()
    path = Path(args.metrics) if args.metrics else run_loop(args.steps, args.overrides)
    load1 = load_average()
    rows = read_steps(path)
    kept = rows[1:] if len(rows) > 1 else rows
    step = statistics.median(r["time/step"] for r in kept)
    table_rows = []
    for part in PARTS:
        vals = [r.get(f"time/{part}", 0.0) for r in kept]
        med = statistics.median(vals)
        table_rows.append([part, f"{med * 1000:,.1f}", f"{100 * med / step:.1f}%"])
    rest = [r["time/step"] - sum(r.get(f"time/{p}", 0.0) for p in PARTS) for r in kept]
    table_rows.append(
        [
            "rest",
            f"{statistics.median(rest) * 1000:,.1f}",
            f"{100 * statistics.median(rest) / step:.1f}%",
        ]
    )
    table_rows.append(["step", f"{step * 1000:,.1f}", "100%"])
    push_share = statistics.median(r["time/push"] / r["time/step"] for r in kept)
    tokens = statistics.median(r.get("response_tokens", float("nan")) for r in kept)
    searches = statistics.median(r.get("mean_searches", float("nan")) for r in kept)
    table = md_table(["part", "median ms", "share of step"], table_rows)
    source = f"`{path}`" if args.metrics else "a fresh run"
    note = (
        f"Weight push = {100 * push_share:.2f}% of a step (median of per-step ratios; target "
        f"<= 2%). Reference loop, `grpo_tiny.yaml` from {source}: 8 questions x 8 rollouts a step, "
        f"{len(kept)} steps after the first; median {tokens:.0f} response tokens "
        f"(sampled + inserted) and {searches:.2f} searches a rollout; {machine_note()}; "
        + (
            "load average unknown (read from an earlier run)"
            if args.metrics
            else f"load average {load0} at start, {load1} at end"
        )
        + f".\n{command_line()}"
    )
    body = f"### GRPO step breakdown (reference loop)\n\n{table}\n\n{note}"
    print(body)
    push = Check("weight push, share of a reference-loop step", 100 * push_share, "<=", 2.0, "%")
    write_result("bench_grpo_breakdown", [push], note.splitlines()[0])
    if args.write_readme:
        update_readme("bench_grpo_breakdown", body)


if __name__ == "__main__":
    main()
