"""The demo's report on hand-made run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from experiments.demo_report import main, summarize_run


def _run(folder: Path, rows: list[dict], torn: bool = False) -> Path:
    folder.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (folder / "metrics.jsonl").write_text(text + ('{"step": 9, "dev/e' if torn else ""))
    return folder


def test_first_and_last_dev_evaluation_per_run(tmp_path, capsys):
    grpo = _run(
        tmp_path / "grpo",
        [
            {"step": 0, "dev/em": 0.25, "dev/f1": 0.3, "dev/valid_answer_rate": 0.9},
            {"step": 1, "reward": 0.5},
            {"step": 10, "dev/em": 0.375, "dev/f1": 0.4, "dev/valid_answer_rate": 1.0},
        ],
        torn=True,
    )
    cer = _run(
        tmp_path / "cer", [{"step": 0, "dev/accuracy": 0.5}, {"step": 5, "dev/accuracy": 0.25}]
    )
    with pytest.warns(UserWarning, match=r"metrics.jsonl:4: dropped a torn last line"):
        s = summarize_run("GRPO", grpo)
    assert (s["metric"], s["steps"], s["before"], s["after"]) == ("em", 10, 0.25, 0.375)
    assert s["extra"]["valid_answer_rate"] == (0.9, 1.0)
    assert s["curve"] == [(0, 0.25), (10, 0.375)]
    out = tmp_path / "demo"
    args = ["--out", str(out), f"GRPO={grpo}", f"CER={cer}", f"gone={tmp_path / 'nothing'}"]
    with pytest.warns(UserWarning, match="dropped a torn last line"):
        assert main(args) == 0
    report = (out / "report.md").read_text()
    assert "| GRPO | " in report and "| 0.250 | 0.375 | +0.125 |" in report
    assert "| CER | " in report and "| accuracy | 0.500 | 0.250 | -0.250 |" in report
    assert "| gone | " in report and "no metrics.jsonl" in report
    assert (out / "curves.png").stat().st_size > 0
    assert main(["--out", str(out), "no-equals-sign"]) == 2
    assert "expected LABEL=RUN_DIR" in capsys.readouterr().err


def _results(run: Path, step: int, rows: list[dict]) -> None:
    (run / "dev_results").mkdir(exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run / "dev_results" / f"step_{step:05d}.jsonl").write_text(text)


def test_the_archive_keeps_first_and_last_results_and_make_results_rewrites_the_table(
    tmp_path, capsys
):
    from experiments.demo_report import archive
    from experiments.results import main as results_main

    grpo = _run(
        tmp_path / "runs" / "grpo",
        [{"step": 0, "dev/em": 0.25}, {"step": 5, "dev/em": 0.5}, {"step": 10, "dev/em": 0.75}],
    )
    for step, ems in ((0, [1, 0, 0, 0]), (5, [1, 1, 0, 0]), (10, [1, 1, 1, 0])):
        _results(grpo, step, [{"id": f"q{i}", "em": float(e)} for i, e in enumerate(ems)])
    # CER's rows hold a flag per sample: accuracy is over all samples (3 of 4, then 1 of 4)
    cer = _run(
        tmp_path / "runs" / "cer",
        [{"step": 0, "dev/accuracy": 0.75}, {"step": 4, "dev/accuracy": 0.25}],
    )
    _results(cer, 0, [{"id": "a", "correct": [1, 1]}, {"id": "b", "correct": [1, 0]}])
    _results(cer, 4, [{"id": "a", "correct": [0, 1]}, {"id": "b", "correct": [0, 0]}])
    dest = tmp_path / "common" / "results" / "tiny" / "demo"
    kept = archive(dest, [("reference GRPO", grpo), ("CER", cer)], "make demo", "abc1234")
    assert [(label, f.name) for label, f in kept] == [
        ("reference GRPO", "reference-grpo"),
        ("CER", "cer"),
    ]
    assert sorted(p.name for p in (dest / "reference-grpo" / "dev_results").iterdir()) == [
        "step_00000.jsonl",
        "step_00010.jsonl",
    ]  # the first and last evaluation only
    manifest = yaml.safe_load((dest / "archive.yaml").read_text())
    assert (manifest["kind"], manifest["commit"]) == ("demo", "abc1234")
    (tmp_path / "docs").mkdir()
    docs = tmp_path / "docs" / "results.md"
    docs.write_text("# R\n\n<!-- results:begin demo -->\nold\n<!-- results:end -->\n")
    assert results_main(["--root", str(tmp_path)]) == 0
    text = docs.read_text()
    assert (
        "| reference GRPO | `common/results/tiny/demo/reference-grpo` | 10 | em | 0.250 | 0.750 | +0.500 |"
        in text
    )
    assert (
        "| CER | `common/results/tiny/demo/cer` | 4 | accuracy | 0.750 | 0.250 | -0.500 |" in text
    )
    assert results_main(["--root", str(tmp_path), "--check"]) == 0
    # a logged number its per-question file does not give is an error naming the file
    _results(dest / "cer", 4, [{"id": "a", "correct": [1, 1]}, {"id": "b", "correct": [0, 0]}])
    assert results_main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cer/dev_results/step_00004.jsonl: dev/accuracy over its questions is 0.500000" in err
    assert "metrics.jsonl logged 0.250000 at step 4" in err
