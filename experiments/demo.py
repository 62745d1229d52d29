"""``make demo``: the tiny world end to end on a CPU, from nothing.

Builds the tiny world, warm-starts the tiny agent on a weak teacher's search paths, evaluates it,
runs the reference GRPO loop, evaluates again, and prints the before/after table and the curve's path.
Stages whose output already exists are reused (delete their folders to start over); an
interrupted GRPO run resumes from its latest checkpoint.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import common
from common.config import load_config
from common.search_grpo import GRPOConfig, train_grpo
from common.warmup import WarmupConfig, run_warmup

CONFIGS = Path(common.__file__).parent / "configs"  # the reference loop's own (common/configs/)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.demo", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--world", default="runs/tinyworld/seed0", help="tiny world folder")
    parser.add_argument("--warmup", default="runs/warmup/tiny", help="warmup folder")
    parser.add_argument("--run-dir", default="runs/grpo/tiny", help="GRPO run folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: the config's")
    parser.add_argument("--grpo-steps", type=int, default=None, help="default: the config's")
    args = parser.parse_args(argv)
    world, warm = Path(args.world), Path(args.warmup)
    if not (world / "manifest.json").exists():
        from common.tinyworld import build_world

        print(f"[demo] building the tiny world (seed {args.seed}) in {world}", flush=True)
        build_world(world, seed=args.seed)

    ws_over = [f"world={world}", f"out={warm}", f"seed={args.seed}"]
    if args.warmup_steps is not None:
        ws_over.append(f"steps={args.warmup_steps}")
    model = warm / "model"
    if not (model / "config.json").exists():
        print(
            "[demo] supervised warmup on a weak teacher's search paths (gold paths, half the bridges cut short)",
            flush=True,
        )
        run_warmup(load_config(WarmupConfig, CONFIGS / "warmup_tiny.yaml", ws_over))

    grpo_over = [
        f"assets.world={world}",
        f"assets.model={model}",
        f"run_dir={args.run_dir}",
        f"seed={args.seed}",
    ]
    if args.grpo_steps is not None:
        grpo_over.append(f"steps={args.grpo_steps}")
    print("[demo] GRPO with exact-match reward, vLLM rollouts, BM25 retrieval", flush=True)
    result = train_grpo(load_config(GRPOConfig, CONFIGS / "grpo_tiny.yaml", grpo_over))
    print(report(result))


def report(result: dict) -> str:
    """The before/after table as markdown, with the curve's path."""
    rows = [("warmup (before RL)", result["before"]), ("after GRPO", result["after"])]
    lines = [
        "\nTiny world dev set, greedy decoding\n",
        "| model | dev EM | dev F1 | answered | searches / question |",
        "|---|---|---|---|---|",
    ]
    for name, m in rows:
        lines.append(
            f"| {name} | {m['em']:.3f} | {m['f1']:.3f} | {m['valid_answer_rate']:.2f} "
            f"| {m['mean_searches']:.2f} |"
        )
    run_dir = Path(result["run_dir"])
    lines.append(f"\ncurve: {run_dir / 'dev_curve.png'}   metrics: {run_dir / 'metrics.jsonl'}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
