"""Shared bits of the rollout and training benchmarks: tables, machine note, README section."""

from __future__ import annotations

import os
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Rollout and training"
INTRO = (
    "Written by `benchmarks/bench_rollout.py` (vLLM vs HF engine on agent rollouts and on "
    "fixed-length generation), `benchmarks/bench_grpo_step.py` (one GRPO step, ours vs TRL's "
    "`GRPOTrainer`) and `benchmarks/bench_grpo_breakdown.py` (where a step of the reference "
    "loop goes). Each table says how it was run. The machine is shared: other jobs ran at the "
    "same time, so the compared variants always run alternately in one process and the tables "
    "give medians.\n"
)


def load_average() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def machine_note() -> str:
    import torch

    return (
        f"{platform.machine()} CPU, 2 shared cores (torch threads {torch.get_num_threads()}), "
        f"torch {torch.__version__}"
    )


def command_line() -> str:
    script = Path(sys.argv[0]).resolve().relative_to(ROOT)
    return (
        "`.venv/bin/python " + " ".join(shlex.quote(a) for a in [str(script), *sys.argv[1:]]) + "`"
    )


def md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def update_readme(key: str, body: str) -> None:
    """Put ``body`` between markers named ``key`` in the README's rollout-and-training section."""
    text = README.read_text(encoding="utf-8") if README.exists() else "# Benchmarks\n"
    if f"\n{SECTION}\n" not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{INTRO}"
    start, end = f"<!-- {key} -->", f"<!-- /{key} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        section = text.index(f"\n{SECTION}\n") + len(f"\n{SECTION}\n")
        following = text.find("\n## ", section)
        cut = len(text) if following < 0 else following
        text = text[:cut].rstrip("\n") + "\n\n" + block + "\n" + text[cut:]
    README.write_text(text, encoding="utf-8")
