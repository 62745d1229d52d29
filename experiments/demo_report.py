"""The demo's report: what ran, dev numbers before and after, and one page of curves.

    python -m experiments.demo_report --out runs/demo \\
        "reference GRPO=runs/grpo/tiny" "EviBack=runs/eviback/tiny" ...

Each ``LABEL=RUN_DIR`` is a run folder with a ``metrics.jsonl``; its first and last dev
evaluation (``dev/em`` for the search agents, ``dev/accuracy`` for CER) go in the table, its dev
curve on the shared plot. A run that is missing or has no dev evaluation is listed as such.
Writes ``<out>/report.md`` and ``<out>/curves.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from common.jsonl import read_jsonl

METRICS = ("dev/em", "dev/accuracy")  # the headline dev metric, first one a run logs
EXTRA = ("dev/f1", "dev/exact_accuracy", "dev/valid_answer_rate", "dev/boxed_rate")


def dev_rows(run_dir: Path) -> list[dict]:
    """The run's dev evaluations, in step order (``common.jsonl.read_jsonl``: a torn last line
    dropped with a warning, another bad line an error naming file:line)."""
    rows = read_jsonl(run_dir / "metrics.jsonl", key="step")
    return sorted((r for r in rows if any(k in r for k in METRICS)), key=lambda r: r["step"])


def summarize_run(label: str, run_dir: Path) -> dict:
    """``{label, run_dir, metric, steps, before, after, extra, curve}`` or ``{label, missing}``."""
    if not (run_dir / "metrics.jsonl").is_file():
        return {"label": label, "run_dir": str(run_dir), "missing": "no metrics.jsonl"}
    rows = dev_rows(run_dir)
    if not rows:
        return {"label": label, "run_dir": str(run_dir), "missing": "no dev evaluation"}
    metric = next(k for k in METRICS if k in rows[0])
    first, last = rows[0], rows[-1]
    return {
        "label": label,
        "run_dir": str(run_dir),
        "metric": metric.removeprefix("dev/"),
        "steps": last["step"],
        "before": first[metric],
        "after": last[metric],
        "extra": {
            k.removeprefix("dev/"): (first[k], last[k]) for k in EXTRA if k in first and k in last
        },
        "curve": [(r["step"], r[metric]) for r in rows],
    }


def markdown(runs: list[dict], curves: str) -> str:
    lines = [
        "# The tiny demo",
        "",
        "Every run on the CPU, offline, from the project's own tiny world and tasks; dev numbers "
        "are greedy. Step 0 is the warmup the run began from.",
        "",
        "| run | folder | RL steps | dev metric | step 0 | last step | change | also (step 0 -> last) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "missing" in r:
            lines.append(f"| {r['label']} | `{r['run_dir']}` | | {r['missing']} | | | | |")
            continue
        extra = ", ".join(f"{k} {a:.3f} -> {b:.3f}" for k, (a, b) in r["extra"].items())
        lines.append(
            f"| {r['label']} | `{r['run_dir']}` | {r['steps']} | {r['metric']} | "
            f"{r['before']:.3f} | {r['after']:.3f} | {r['after'] - r['before']:+.3f} | {extra} |"
        )
    lines += ["", f"![dev curves]({curves})", ""]
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in runs if "curve" in r]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(3.2 * max(len(shown), 1), 2.8))
    axes = axes if hasattr(axes, "__len__") else [axes]
    for ax, r in zip(axes, shown, strict=False):
        steps, values = zip(*r["curve"], strict=True)
        ax.plot(steps, values, marker="o", ms=3)
        ax.set_title(r["label"], fontsize=9)
        ax.set_xlabel("RL step")
        ax.set_ylabel(f"dev {r['metric']}")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, runs: list[tuple[str, Path]]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarize_run(label, run_dir) for label, run_dir in runs]
    plot(summaries, out / "curves.png")
    (out / "report.md").write_text(markdown(summaries, "curves.png"), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.demo_report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="runs/demo", help="report folder")
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    args = parser.parse_args(argv)
    runs = []
    for item in args.runs:
        label, sep, run_dir = item.partition("=")
        if not sep or not label or not run_dir:
            print(f"error: expected LABEL=RUN_DIR, got {item!r}", file=sys.stderr)
            return 2
        runs.append((label, Path(run_dir)))
    path = write_report(Path(args.out), runs)
    print(path.read_text(encoding="utf-8"))
    print(f"[demo] report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
