"""The plots of ``experiments.evaluate_all``: per benchmark, bars with 95% intervals per run; the
training curves of every run on one page (each run's dev metric from its ``metrics.jsonl``, as
``experiments.demo_report`` reads it)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.demo_report import summarize_run
from experiments.method_kinds import KIND, PAIRED


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def benchmark_bars(report: dict[str, Any]) -> dict[str, dict[str, list[tuple]]]:
    """``{benchmark: {metric: [(run, value, ci_low, ci_high), ...]}}`` for the paired metrics
    (the headline ones) of every evaluated run."""
    out: dict[str, dict[str, list[tuple]]] = {}
    for r in report["runs"]:
        for bench, b in r.get("benchmarks", {}).items():
            for metric in PAIRED[KIND[r["method"]]]:
                m = b["metrics"].get(metric)
                if m is not None:
                    bars = out.setdefault(bench, {}).setdefault(metric, [])
                    bars.append((r["run"], m["value"], m["ci_low"], m["ci_high"]))
    return out


def plot_benchmarks(report: dict[str, Any], out: Path) -> list[Path]:
    """``<out>/bench_<benchmark>.png``: one panel per metric, one bar per run with its interval."""
    plt = _pyplot()
    paths = []
    for bench, metrics in benchmark_bars(report).items():
        width = max(4.0, 0.45 * max(len(v) for v in metrics.values()) + 1.5)
        fig, axes = plt.subplots(1, len(metrics), figsize=(width * len(metrics), 3.6))
        axes = axes if hasattr(axes, "__len__") else [axes]
        for ax, (metric, bars) in zip(axes, metrics.items(), strict=True):
            names, values, lows, highs = zip(*bars, strict=True)
            err = [
                [v - lo for v, lo in zip(values, lows, strict=True)],
                [hi - v for v, hi in zip(values, highs, strict=True)],
            ]
            ax.bar(range(len(values)), values, yerr=err, capsize=3, color="tab:blue", alpha=0.8)
            ax.set_xticks(range(len(values)), names, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel(metric)
            ax.set_title(f"{bench}: {metric} (95% bootstrap)", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = out / f"bench_{re.sub(r'[^A-Za-z0-9_.-]+', '_', bench)}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_curves(runs: Sequence[Any], path: Path) -> Path | None:
    """Every run's dev curve on one page, a panel per run (runs without dev evaluations are
    left out); None when no run has one."""
    curves = []
    for run in runs:
        if (run.path / "metrics.jsonl").is_file():
            s = summarize_run(run.name, run.path)
            if "curve" in s:
                curves.append((run, s))
    if not curves:
        return None
    plt = _pyplot()
    cols = min(4, len(curves))
    rows = math.ceil(len(curves) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.6 * rows), squeeze=False)
    for ax, (run, s) in zip(axes.flat, curves, strict=False):
        steps, values = zip(*s["curve"], strict=True)
        ax.plot(steps, values, marker="o", ms=3)
        ax.set_title(f"{run.name}\n({run.arm})", fontsize=7)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylabel(f"dev {s['metric']}", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(curves) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
