"""The READMEs stay short: a budget in lines and bytes for the top README and each package's.

A README holds what a reader needs first (the method, its commands, its choices, a results
summary with links); what grows with every run goes beside it, and the failure says where.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# page -> (most lines, most KiB, where the extra prose goes)
BUDGETS = {
    "README.md": (
        200,
        16,
        "a topic's detail to its page under docs/ (docs/README.md lists them), a result to "
        "docs/results.md",
    ),
    "arco/README.md": (
        300,
        24,
        "runs and their tables to docs/arco_results_log.md, implementation detail to "
        "docs/arco_internals.md",
    ),
    "cer/README.md": (
        300,
        24,
        "runs and their tables to docs/cer_results_log.md, implementation detail to "
        "docs/cer_internals.md",
    ),
    "eviback/README.md": (
        300,
        24,
        "runs and their tables to docs/eviback_results_log.md, implementation detail to "
        "docs/eviback_internals.md",
    ),
    "benchmarks/README.md": (
        300,
        24,
        "a benchmark's tables and how it was run to benchmarks/RESULTS.md",
    ),
}


def over_budget(text: str, max_lines: int, max_kib: int) -> list[str]:
    """What of ``text`` is over the budget: its lines, its size (empty when within)."""
    lines, size = len(text.splitlines()), len(text.encode("utf-8"))
    over = []
    if lines > max_lines:
        over.append(f"{lines} lines (budget {max_lines})")
    if size > max_kib * 1024:
        over.append(f"{size / 1024:.1f} KiB (budget {max_kib} KiB)")
    return over


def test_over_budget_counts_lines_and_bytes():
    assert over_budget("a\nb\n", 2, 1) == []
    assert over_budget("a\nb\nc\n", 2, 1) == ["3 lines (budget 2)"]
    # 600 two-byte characters: 1,200 bytes, over 1 KiB
    assert over_budget("é" * 600, 5, 1) == ["1.2 KiB (budget 1 KiB)"]


@pytest.mark.parametrize("page", sorted(BUDGETS))
def test_readme_within_budget(page):
    max_lines, max_kib, elsewhere = BUDGETS[page]
    over = over_budget((ROOT / page).read_text(encoding="utf-8"), max_lines, max_kib)
    assert not over, (
        f"{page} is over its budget: {', '.join(over)}; keep a summary and a link there and move "
        f"{elsewhere}"
    )
