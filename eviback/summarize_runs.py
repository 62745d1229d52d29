"""A markdown table of EviBack vs baseline runs over seeds, from their ``metrics.jsonl``.

    python -m eviback.summarize_runs runs/eviback/measure

Run folders are named ``{method}_s{seed}``. Per method: dev F1 and EM before and after training
(mean ± sample std over seeds, and the per-seed values) and the mean share of all-zero groups
over the training steps.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from common.train import read_metrics

_RUN = re.compile(r"(?P<method>.+)_s(?P<seed>\d+)")


def run_summary(run_dir: Path) -> dict[str, float]:
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [r for r in rows if "dev/f1" in r]
    steps = [r for r in rows if "all_zero_share" in r]
    if len(evals) < 2 or not steps:
        raise ValueError(f"{run_dir}: unfinished run (needs two dev evaluations)")
    return {
        "f1_before": evals[0]["dev/f1"],
        "em_before": evals[0]["dev/em"],
        "f1_after": evals[-1]["dev/f1"],
        "em_after": evals[-1]["dev/em"],
        "all_zero_share": statistics.fmean(r["all_zero_share"] for r in steps),
        "steps": steps[-1]["step"],
    }


def _spread(xs: Sequence[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.fmean(xs):.3f} ± {sd:.3f} ({', '.join(f'{x:.2f}' for x in xs)})"


def table(root: Path) -> str:
    runs: dict[str, list[dict[str, float]]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        m = _RUN.fullmatch(d.name)
        if m and (d / "metrics.jsonl").is_file():
            try:
                runs.setdefault(m["method"], []).append(run_summary(d))
            except ValueError as e:
                print(f"skipped: {e}", file=sys.stderr)
    lines = [
        "| method | seeds | steps | dev F1 before | dev F1 after | dev EM after | all-zero share |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, rs in sorted(runs.items()):
        lines.append(
            f"| {method} | {len(rs)} | {rs[0]['steps']:.0f} | "
            f"{_spread([r['f1_before'] for r in rs])} | {_spread([r['f1_after'] for r in rs])} | "
            f"{_spread([r['em_after'] for r in rs])} | "
            f"{_spread([r['all_zero_share'] for r in rs])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/eviback/measure")), end="")
