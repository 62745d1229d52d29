"""The demo's report: what ran, dev numbers before and after, and one page of curves.

    python -m experiments.demo_report --out runs/demo \\
        "reference GRPO=runs/grpo/tiny" "EviBack=runs/eviback/tiny" ...

Each ``LABEL=RUN_DIR`` is a run folder with a ``metrics.jsonl``; its first and last dev
evaluation (``dev/em`` for the search agents, ``dev/accuracy`` for CER) go in the table, its dev
curve on the shared plot. A run that is missing or has no dev evaluation is listed as such.
Writes ``<out>/report.md`` and ``<out>/curves.png``.

``--archive DIR`` keeps the demo with the code: each run's ``metrics.jsonl``, ``config.yaml``
and per-question results of its first and last dev evaluation (``dev_results/``, and
``test_results/`` where the run has them) in ``DIR/<label>/``, the report and curves in ``DIR``
and an ``archive.yaml`` (``kind: demo``, the runs, the command and the commit); ``make
results`` (``experiments.results``) then rewrites the demo's table in docs/results.md from
there, each step's number recomputed from the per-question file (and checked against the
logged one).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

import yaml

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


def per_question_value(metric: str, path: Path) -> float:
    """``metric`` (``dev/em``, ``dev/accuracy``) recomputed from a per-question results file:
    the mean of ``em``, or for CER's samples all ``correct`` flags over all samples (avg@k)."""
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no per-question rows")
    if metric == "dev/em":
        return sum(r["em"] for r in rows) / len(rows)
    flags = [
        c
        for r in rows
        for c in (r["correct"] if isinstance(r["correct"], list) else [r["correct"]])
    ]
    return sum(flags) / len(flags)


def check_per_question(summary: dict) -> None:
    """The first and last logged numbers against their per-question files, where the run has
    them (``dev_results/step_NNNNN.jsonl``); a difference is an error naming the file."""
    folder = Path(summary["run_dir"]) / "dev_results"
    metric = "dev/" + summary["metric"]
    for step, logged in (
        (summary["curve"][0][0], summary["before"]),
        (summary["steps"], summary["after"]),
    ):
        path = folder / f"step_{step:05d}.jsonl"
        if path.is_file() and abs(per_question_value(metric, path) - logged) > 1e-9:
            raise ValueError(
                f"{path}: {metric} over its questions is {per_question_value(metric, path):.6f}, "
                f"metrics.jsonl logged {logged:.6f} at step {step}"
            )


def table(runs: list[dict]) -> list[str]:
    """The before/after table, a row per run."""
    lines = [
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
    return lines


def markdown(runs: list[dict], curves: str) -> str:
    head = [
        "# The tiny demo",
        "",
        "Every run on the CPU, offline, from the project's own tiny world and tasks; dev numbers "
        "are greedy. Step 0 is the warmup the run began from.",
        "",
    ]
    return "\n".join([*head, *table(runs), "", f"![dev curves]({curves})", ""])


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
    for s in summaries:
        if "missing" not in s:
            check_per_question(s)
    plot(summaries, out / "curves.png")
    (out / "report.md").write_text(markdown(summaries, "curves.png"), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(summaries, indent=1) + "\n", encoding="utf-8")
    return out / "report.md"


def folder_name(label: str) -> str:
    """A run's folder in the archive: its label in lower case, other characters as ``-``."""
    return re.sub(r"[^a-z0-9+]+", "-", label.lower()).strip("-")


def archive(
    dest: Path, runs: list[tuple[str, Path]], command: str, commit: str
) -> list[tuple[str, Path]]:
    """Each run's log, config and first and last per-question results into ``dest/<label>``
    and ``dest/archive.yaml``; the archived runs, as (label, folder) pairs."""
    out = []
    for label, run_dir in runs:
        s = summarize_run(label, run_dir)
        if "missing" in s:
            raise ValueError(f"{run_dir}: {s['missing']}; nothing to archive for {label!r}")
        target = dest / folder_name(label)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in ("metrics.jsonl", "config.yaml"):
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, target / name)
        steps = {s["curve"][0][0], s["steps"]}
        for sub in ("dev_results", "test_results"):
            for step in steps:
                src = run_dir / sub / f"step_{step:05d}.jsonl"
                if src.is_file():
                    (target / sub).mkdir(exist_ok=True)
                    shutil.copy2(src, target / sub / src.name)
        out.append((label, target))
    manifest = {
        "kind": "demo",
        "name": "demo",
        "title": "The tiny demo (make demo): one seed a run, dev before and after",
        "command": command,
        "commit": commit,
        "runs": [{"label": label, "folder": folder.name} for label, folder in out],
    }
    (dest / "archive.yaml").write_text(
        "# The demo's runs, kept: `make results` rewrites docs/results.md's demo table from them.\n"
        + yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True),
        encoding="utf-8",
    )
    return out


def archived_runs(folder: Path) -> list[tuple[str, Path]]:
    """A demo archive's runs (``archive.yaml``'s ``runs``), as (label, folder) pairs."""
    manifest = yaml.safe_load((folder / "archive.yaml").read_text(encoding="utf-8"))
    try:
        return [(r["label"], folder / r["folder"]) for r in manifest["runs"]]
    except (KeyError, TypeError):
        raise ValueError(f"{folder / 'archive.yaml'}: `runs` must list {{label, folder}}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.demo_report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="runs/demo", help="report folder")
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    parser.add_argument(
        "--archive", default=None, help="also keep the runs' results in this folder"
    )
    parser.add_argument("--command", default="make demo", help="what made the runs (archive.yaml)")
    args = parser.parse_args(argv)
    runs = []
    for item in args.runs:
        label, sep, run_dir = item.partition("=")
        if not sep or not label or not run_dir:
            print(f"error: expected LABEL=RUN_DIR, got {item!r}", file=sys.stderr)
            return 2
        runs.append((label, Path(run_dir)))
    path = write_report(Path(args.out), runs)
    if args.archive:
        from experiments.compare import head_commit

        kept = archive(Path(args.archive), runs, args.command, head_commit())
        print(f"[demo] archived in {write_report(Path(args.archive), kept)}")
    print(path.read_text(encoding="utf-8"))
    print(f"[demo] report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
