"""A benchmark's result file: its measured ratios against their targets, for ``make bench``.

Each script calls ``write_result`` once per table; ``benchmarks/summary.py`` reads the files
(``runs/bench/<name>.json``, or under ``$BENCH_DIR``) into one table. A check is a measured value
with its target (``op`` ``>=`` or ``<=`` against ``target``), or ``op="report"`` for a number
shown without a target.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from common.jsonl import write_atomic

ROOT = Path(__file__).resolve().parent.parent
OPS = (">=", "<=", "report")


@dataclass(frozen=True)
class Check:
    """One measured number and its target."""

    what: str
    value: float
    op: str = "report"
    target: float | None = None
    unit: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"check {self.what!r}: op must be one of {OPS}, got {self.op!r}")
        if (self.op == "report") != (self.target is None):
            raise ValueError(f"check {self.what!r}: a target goes with >= or <=, never alone")

    @property
    def met(self) -> bool | None:
        """Whether the value meets the target (None: no target)."""
        if self.op == "report" or self.target is None:
            return None
        return self.value >= self.target if self.op == ">=" else self.value <= self.target


def bench_dir() -> Path:
    """Where result files go: ``$BENCH_DIR`` or ``runs/bench`` under the project root."""
    return Path(os.environ.get("BENCH_DIR") or ROOT / "runs" / "bench")


def write_result(name: str, checks: list[Check], setting: str = "") -> Path:
    """Write ``<bench_dir>/<name>.json``: status ok, the checks, the setting and command line."""
    out = bench_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    record = {
        "name": name,
        "status": "ok",
        "checks": [asdict(c) for c in checks],
        "setting": setting,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
    }
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return path
