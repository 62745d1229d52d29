"""Evaluation summaries and the paired bootstrap on hand-made per-question results."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.rollout.trajectory import Step, Trajectory
from eviback.cli import main
from eviback.evaluate import (
    QuestionResult,
    markdown_table,
    paired_bootstrap,
    question_result,
    read_results,
    summarize_by_benchmark,
    write_results,
)


def q(i: int, bench: str, f1: float, searches: int = 1, dups: int = 0, valid: bool = True):
    return QuestionResult(f"{bench}:{i}", bench, float(f1 == 1.0), f1, valid, searches, dups,
                          not valid)  # fmt: skip


def test_micro_and_per_benchmark_summaries():
    rows = [q(0, "nq", 1.0, 2, 1), q(1, "nq", 0.5, 2), q(0, "hotpotqa", 0.0, 0, 0, False)]
    s = summarize_by_benchmark(rows)
    assert s["all"]["f1"] == pytest.approx(0.5) and s["all"]["em"] == pytest.approx(1 / 3)
    assert s["all"]["duplicate_query_rate"] == pytest.approx(1 / 3)  # questions with a repeat
    assert s["all"]["duplicates_per_search"] == pytest.approx(1 / 4)  # Σ dups / Σ searches
    assert s["all"]["mean_searches"] == pytest.approx(4 / 3)
    assert s["nq"]["f1"] == 0.75 and s["nq"]["valid_answer_rate"] == 1.0
    assert s["hotpotqa"]["forced_termination_rate"] == 1.0
    assert s["hotpotqa"]["duplicate_query_rate"] == 0.0  # no search: 0, not a division error
    assert "| nq | 2 | 0.7500 |" in markdown_table(s)


def test_single_and_multi_hop_macro_f1_beside_the_micro_f1():
    rows = [q(0, "nq", 1.0), q(1, "nq", 0.5), q(0, "triviaqa", 0.0), q(0, "hotpotqa", 0.0),
            q(0, "2wiki", 1.0), q(1, "2wiki", 1.0), q(2, "2wiki", 1.0)]  # fmt: skip
    s = summarize_by_benchmark(rows)["all"]
    assert s["f1"] == pytest.approx(4.5 / 7)  # micro
    assert s["single_hop_macro_f1"] == pytest.approx((0.75 + 0.0) / 2)
    assert s["multi_hop_macro_f1"] == pytest.approx((0.0 + 1.0) / 2)
    table = markdown_table(summarize_by_benchmark(rows))
    assert "single-hop macro F1: 0.3750; multi-hop macro F1: 0.5000" in table
    only_nq = summarize_by_benchmark(rows[:2])["all"]
    assert "multi_hop_macro_f1" not in only_nq and only_nq["single_hop_macro_f1"] == 0.75


def test_valid_answer_is_an_answer_from_a_well_formed_trajectory():
    """An invalid turn, then the right answer: not a valid answer, and (the release) no EM or F1;
    with well_formed_only=False the answer scores."""
    steps = [Step("invalid", 0, 1), Step("answer", 1, 2)]
    t = Trajectory("g", 0, "nq:7", "Who?", ["Ann Lee"], [1], steps=steps, answer="Ann Lee",
                   num_invalid=1)  # fmt: skip
    r = question_result(t)
    assert (r.valid, r.em, r.f1, r.answer) == (False, 0.0, 0.0, "Ann Lee")
    r = question_result(t, well_formed_only=False)
    assert (r.valid, r.em, r.f1) == (False, 1.0, 1.0)
    t.num_invalid, t.steps = 0, steps[1:]
    assert question_result(t) == QuestionResult(
        "nq:7", "nq", 1.0, 1.0, True, 0, 0, False, "Ann Lee"
    )


def test_bootstrap_of_a_constant_difference_is_that_difference():
    a = [q(i, "nq", 0.0) for i in range(20)]
    b = [q(i, "nq", 0.5) for i in range(20)]
    out = paired_bootstrap(a, b, "f1", resamples=500)
    assert out["delta"] == out["ci_low"] == out["ci_high"] == 0.5 and out["p_le_0"] == 0.0


def test_bootstrap_interval_matches_hand_computed_spread():
    # differences: half +1, half 0 -> Δ = 0.5; the mean of n = 400 draws has sd 0.5/20 = 0.025
    a = [q(i, "nq", 0.0) for i in range(400)]
    b = [q(i, "nq", 1.0 if i % 2 else 0.0) for i in range(400)]
    out = paired_bootstrap(a, b, "f1", resamples=10_000)
    assert out["delta"] == 0.5
    assert out["ci_low"] == pytest.approx(0.5 - 1.96 * 0.025, abs=0.01)
    assert out["ci_high"] == pytest.approx(0.5 + 1.96 * 0.025, abs=0.01)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.integers(0, 5))
def test_bootstrap_interval_contains_nothing_outside_the_range_of_differences(f1s, seed):
    a = [q(i, "x", 0.5) for i in range(len(f1s))]
    b = [q(i, "x", f) for i, f in enumerate(f1s)]
    out = paired_bootstrap(a, b, "f1", resamples=200, seed=seed)
    diffs = [f - 0.5 for f in f1s]
    assert min(diffs) - 1e-9 <= out["ci_low"] <= out["ci_high"] <= max(diffs) + 1e-9


def test_unpaired_runs_are_an_error():
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap([q(0, "a", 1), q(1, "a", 1)], [q(0, "a", 1)])


def test_cli_compare_reads_result_files(tmp_path, capsys):
    write_results(tmp_path / "base.jsonl", [q(i, "nq", 0.0) for i in range(10)])
    write_results(tmp_path / "new.jsonl", [q(i, "nq", 1.0) for i in range(10)])
    assert read_results(tmp_path / "new.jsonl")[3] == q(3, "nq", 1.0)
    assert (
        main(["eval", "--compare", str(tmp_path / "base.jsonl"), str(tmp_path / "new.jsonl")]) == 0
    )
    out = capsys.readouterr().out
    assert "| f1 | 10 | +1.0000 | [+1.0000, +1.0000] (95%) | 0.0000 |" in out
    (tmp_path / "bad.jsonl").write_text('{"id": "x"}\n')
    assert (
        main(["eval", "--compare", str(tmp_path / "bad.jsonl"), str(tmp_path / "new.jsonl")]) == 2
    )
    assert "bad.jsonl:1" in capsys.readouterr().err
