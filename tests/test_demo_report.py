"""The demo's report on hand-made run folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
