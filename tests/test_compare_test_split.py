"""The held-out test split in experiments.compare and experiments.results: runs' test_results/
reported beside dev (comparison_test.md/.json), archived, and recomputed from an archive."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
import yaml

from experiments import results
from experiments.compare import HELD_OUT, main

# Test split, 4 questions. Step 0: seed 0 gets none right, seed 1 gets t3. Step 2: seed 0 gets
# t0 and t1, seed 1 gets t0 and t3. Δ (final − own start) per question, mean over the seeds:
# t0 (1 + 1) / 2 = 1, t1 (1 + 0) / 2 = 0.5, t2 0, t3 (0 + 0) / 2 = 0: mean 0.375.
TEST_RIGHT = {(0, 0): set(), (1, 0): {3}, (0, 2): {0, 1}, (1, 2): {0, 3}}
DELTAS = [1.0, 0.5, 0.0, 0.0]


def _rows(right: set[int], n: int, prefix: str) -> str:
    rows = [{"id": f"{prefix}{q}", "em": float(q in right), "f1": 0.0} for q in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _runs(out: Path, arm: str = "grpo", test: bool = True) -> None:
    """Two seeds of ``arm`` in ``out``: dev (6 questions, q0 right at step 2) and test results."""
    for seed in (0, 1):
        run = out / arm / f"s{seed}"
        for step in (0, 2):
            dev = run / "dev_results" / f"step_{step:05d}.jsonl"
            dev.parent.mkdir(parents=True, exist_ok=True)
            dev.write_text(_rows({0} if step else set(), 6, "q"))
            if test:
                path = run / "test_results" / f"step_{step:05d}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(_rows(TEST_RIGHT[seed, step], 4, "t"))
        (run / ".compare_done").write_text("1 s\n")


def _spec(path: Path, out: Path, arms: tuple[str, ...] = ("grpo",), baseline: str = "start"):
    spec = {"out": str(out), "seeds": [0, 1], "metric": "em", "baseline": baseline,
            "arms": [{"name": a, "command": ["x"]} for a in arms]}  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_test_split_is_reported_beside_dev_with_hand_computed_numbers(tmp_path, capsys):
    out = tmp_path / "cmp"
    _runs(out)
    spec = _spec(tmp_path / "spec.yaml", out)
    assert main(["--spec", str(spec), "--report-only"]) == 0
    assert "comparison.json, comparison_test.md, curves.png" in capsys.readouterr().out
    test = json.loads((out / "comparison_test.json").read_text())
    assert test["split"] == "test"
    c = test["comparisons"]["grpo"]
    assert c["n"] == 4 and c["delta"] == pytest.approx(0.375)
    assert c["mde"] == pytest.approx(2.8 * statistics.stdev(DELTAS) / math.sqrt(4))
    assert "seeds_and_questions" in c and c["verdict"]["interval"] == "seeds_and_questions"
    arm = test["arms"]["grpo"]
    assert arm["start"] == pytest.approx(0.125) and arm["final_per_seed"] == [0.5, 0.5]
    assert arm["curve"]["step"] == []  # evaluated at the ends only: no curve
    text = (out / "comparison_test.md").read_text()
    assert text.startswith(HELD_OUT)
    assert "n = 4 test questions" in text and "test em (greedy)" in text
    assert "| grpo | 2 | 0.125 | 0.500 ± 0.000 | 0.500, 0.500 | – | +0.375 |" in text
    # the dev report is the dev one (6 questions, Δ 1/6) and names the test report
    dev = json.loads((out / "comparison.json").read_text())
    assert "split" not in dev and dev["comparisons"]["grpo"]["delta"] == pytest.approx(1 / 6)
    assert dev["test_report"] == "comparison_test.md"
    assert "Held-out test split: `comparison_test.md`" in (out / "comparison.md").read_text()
    # another field of the same runs: its own pair of test files
    assert main(["--spec", str(spec), "--report-only", "--metric", "f1"]) == 0
    assert json.loads((out / "comparison_f1_test.json").read_text())["metric"] == "f1"


def test_against_a_baseline_arm_the_finals_are_paired(tmp_path):
    out = tmp_path / "cmp"
    _runs(out, "grpo")
    _runs(out, "other")
    for seed in (0, 1):  # `other` gets only t0 at the end, at both seeds
        (out / "other" / f"s{seed}" / "test_results" / "step_00002.jsonl").write_text(
            _rows({0}, 4, "t")
        )
    spec = _spec(tmp_path / "spec.yaml", out, ("other", "grpo"), baseline="other")
    assert main(["--spec", str(spec), "--report-only"]) == 0
    test = json.loads((out / "comparison_test.json").read_text())
    # grpo − other per question: t0 0, t1 0.5, t2 0, t3 0.5: mean 0.25
    assert test["comparisons"]["grpo"]["delta"] == pytest.approx(0.25)


def test_runs_without_a_trained_test_result_give_no_test_report_or_are_missing(tmp_path):
    out = tmp_path / "cmp"
    _runs(out)
    spec = _spec(tmp_path / "spec.yaml", out)
    (out / "grpo" / "s1" / "test_results" / "step_00002.jsonl").unlink()  # stopped after step 0
    assert main(["--spec", str(spec), "--report-only"]) == 0
    test = json.loads((out / "comparison_test.json").read_text())
    assert [m["seed"] for m in test["missing"]] == [1]
    assert test["comparisons"]["grpo"]["delta"] == pytest.approx(0.5)  # seed 0 alone
    assert (
        "Missing (no test results at step 0 or after it): grpo s1"
        in (out / "comparison_test.md").read_text()
    )
    (out / "grpo" / "s0" / "test_results" / "step_00002.jsonl").unlink()
    (out / "comparison_test.md").unlink()
    assert main(["--spec", str(spec), "--report-only"]) == 0
    assert not (out / "comparison_test.md").exists()
    assert "test_report" not in json.loads((out / "comparison.json").read_text())


def test_archive_copies_test_results_and_make_results_recomputes_the_test_report(tmp_path, capsys):
    out = tmp_path / "cmp"
    _runs(out)
    (tmp_path / "pkg").mkdir()
    spec = _spec(tmp_path / "pkg" / "spec.yaml", out)
    arch = tmp_path / "pkg" / "results" / "toy"
    assert main(["--spec", str(spec), "--report-only", "--archive", str(arch)]) == 0
    assert sorted(p.name for p in (arch / "grpo" / "s1" / "test_results").iterdir()) == [
        "step_00000.jsonl",
        "step_00002.jsonl",
    ]
    want = (out / "comparison_test.json").read_text()
    assert (arch / "comparison_test.json").read_text() == want
    # experiments.results over the archive (its spec relative to the root), beside an old
    # archive without a test split
    manifest = {"name": "toy", "title": "A toy", "short": "toy", "spec": "pkg/spec.yaml",
                "metrics": ["em"], "command": "make toy", "commit": "abc1234"}  # fmt: skip
    (arch / "archive.yaml").write_text(yaml.safe_dump(manifest))
    old = tmp_path / "pkg" / "results" / "old"
    _runs(old, test=False)
    (old / "archive.yaml").write_text(yaml.safe_dump({**manifest, "name": "old"}))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text(
        "".join(
            f"<!-- results:begin {n} -->\n<!-- results:end -->\n"
            for n in ("summary", "detectable", "toy", "old")
        )  # fmt: skip
    )
    for f in arch.glob("comparison*"):
        f.unlink()
    capsys.readouterr()
    assert results.main(["--root", str(tmp_path)]) == 0
    assert "[results] old: no test split archived" in capsys.readouterr().out
    assert (arch / "comparison_test.json").read_text() == want
    assert (arch / "comparison_test.md").read_text() == (out / "comparison_test.md").read_text()
    assert (arch / "comparison.md").read_text() == (out / "comparison.md").read_text()
    assert not list(old.glob("comparison*_test.*"))
    docs = (tmp_path / "docs" / "results.md").read_text()
    toy = docs.split("results:begin toy")[1].split("results:end")[0]
    assert "Held-out test split (each run's final policy and its step 0; n = 4 test" in toy
    assert "| grpo | em | 0.000 → 0.167 | +0.167 |" in toy  # dev: q0 of 6
    assert "| grpo | em | 0.125 → 0.500 | +0.375 |" in toy  # test
    assert "Held-out" not in docs.split("results:begin old")[1]
    assert results.main(["--root", str(tmp_path), "--check"]) == 0
