"""One table of every benchmark's measured ratios against their targets, from the result files.

Reads ``<dir>/*.json`` (written by ``bench_result.write_result``, or by ``run_bench.py`` for a
script that failed) and prints one row per check: measured value, target, met or not; a failed
script is a row of its own with its error. The cost model at the papers' shapes follows
(``cost_model.py``). Writes ``<dir>/summary.md``.

    .venv/bin/python benchmarks/summary.py [runs/bench]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_result import Check, bench_dir  # noqa: E402


def load_results(directory: Path, order: list[str] | None = None) -> list[dict]:
    """The result records in ``directory``: those named in ``order`` first (a missing one is a
    failed record), then any others by name. A file that is not valid JSON is a failed record."""
    records: dict[str, dict] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            record = {"status": "failed", "error": f"{path}: unreadable result ({e})"}
        records[path.stem] = {"name": path.stem, **record}
    names = list(order or []) + [n for n in records if n not in (order or [])]
    return [
        records.get(n, {"name": n, "status": "failed", "error": "no result file"}) for n in names
    ]


def fmt(value: float, unit: str = "") -> str:
    """A value for the table: 3 significant digits, the unit after it."""
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        text = f"{value:.1e}"
    else:
        text = f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text}{unit if unit in ('x', '%') else ' ' + unit if unit else ''}"


def summary_rows(records: list[dict]) -> list[list[str]]:
    """Rows ``[benchmark, what, measured, target, met]``; a failed record keeps its checks (if it
    wrote any) and gets a row saying why it failed."""
    rows = []
    for rec in records:
        for c in rec.get("checks", []):
            check = Check(**c)
            target = "-" if check.target is None else f"{check.op} {fmt(check.target, check.unit)}"
            met = {True: "met", False: "NOT met", None: "reported"}[check.met]
            rows.append([rec["name"], check.what, fmt(check.value, check.unit), target, met])
        if rec.get("status") != "ok":
            error = str(rec.get("error", "")).strip().replace("|", "/").replace("\n", " ")
            rows.append([rec["name"], "(script)", f"failed: {error[:160]}", "-", "failed"])
    return rows


def summary_table(records: list[dict]) -> str:
    head = ["benchmark", "what", "measured", "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in summary_rows(records)]
    counts = [r[4] for r in summary_rows(records)]
    tally = (
        f"{counts.count('met')} met, {counts.count('NOT met')} not met, "
        f"{counts.count('reported')} reported without a target, "
        f"{counts.count('failed')} failed script(s)"
    )
    return "\n".join(lines) + "\n\n" + tally


def cost_section() -> str:
    """The cost model's table, or one line saying why it could not be computed."""
    try:
        from cost_model import cost_table

        return cost_table()
    except (Exception, SystemExit) as e:  # the ratios above still stand
        return f"cost model failed: {type(e).__name__}: {e}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", type=Path, default=None)
    parser.add_argument("--no-cost-model", action="store_true", help="the ratios only")
    args = parser.parse_args(argv)
    directory = args.directory or bench_dir()
    order_file = directory / "order.txt"  # run_bench.py's scripts, in the order they ran
    order = order_file.read_text().split() if order_file.exists() else None
    text = "## Benchmarks against their targets\n\n" + summary_table(load_results(directory, order))
    if not args.no_cost_model:
        text += "\n\n## Cost model at the papers' shapes\n\n" + cost_section()
    print(text)
    (directory / "summary.md").write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
