"""`cer eval` on two ranks (torchrun on CPU, the stand-in for two GPUs): each rank joins the group
and samples its share of the problems; the rows come back in the benchmark's order, the greedy
results are the one-process run's, and rank 0 alone writes and prints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cer.config import CERConfig
from cer.evaluate import run_eval
from cer.tasks.build import build_tiny
from common.config import load_config

pytestmark = pytest.mark.slow
TINY = "cer/configs/tiny.yaml"


def overrides(task: Path, out: Path) -> list[str]:
    return [
        f"assets.model={task / 'model'}",
        f"assets.eval.tiny_test={task / 'test.jsonl'}",
        f"run_dir={out}",
        f"eval.out={out / 'eval'}",
        "eval.k=2",
        "eval.max_tokens=12",
    ]


def test_two_ranks_share_the_problems_and_rank_0_writes_the_one_process_results(
    tmp_path, launch_two_ranks
):
    task = build_tiny(tmp_path / "task", seed=0, n_train=30, n_dev=4, n_test=5)  # 3 + 2 problems
    one = run_eval(load_config(CERConfig, TINY, overrides(task, tmp_path / "one")))
    run = launch_two_ranks(
        ["-m", "cer", "eval", "--config", TINY, *overrides(task, tmp_path / "two")], torchrun=True
    )
    output = run.stdout[-10000:] + run.stderr[-10000:]
    assert run.returncode == 0, output
    assert run.stdout.count("[cer eval] tiny_test") == 1, output  # rank 0 only
    saved = json.loads((tmp_path / "two" / "eval" / "results.json").read_text())
    assert saved["ranks"] == 2
    two = saved["results"]["tiny_test"]
    assert two["problems"] == one["tiny_test"]["problems"] == 5
    assert (two["greedy"], two["greedy_exact"]) == (
        one["tiny_test"]["greedy"],
        one["tiny_test"]["greedy_exact"],
    )
    rows = {
        n: json.loads((tmp_path / n / "eval" / "tiny_test.json").read_text())
        for n in ("one", "two")
    }
    ids = [r["id"] for r in rows["one"]["sampled_rows"]]
    assert len(set(ids)) == 5 and [r["id"] for r in rows["two"]["sampled_rows"]] == ids
    assert rows["two"]["greedy_rows"] == rows["one"]["greedy_rows"]
    assert all(len(r["answers"]) == 2 for r in rows["two"]["sampled_rows"])
    samples = sum(sum(r["correct"]) for r in rows["two"]["sampled_rows"])
    assert two["avg@2"] == samples / 10


def test_eval_all_evaluates_a_cer_run_on_two_ranks(tmp_path):
    """eval-all's worker under torchrun with --ranks 2: CER's evaluator shards the problems and
    rank 0 alone writes the record, every problem once, in the benchmark's order."""
    from common.config import dump_config
    from experiments.evaluate_all import evaluate_all, subprocess_evaluator

    task = build_tiny(tmp_path / "task", seed=0, n_train=30, n_dev=4, n_test=5)
    run = tmp_path / "runs" / "cer"
    cfg = load_config(CERConfig, TINY, overrides(task, run))
    dump_config(cfg, run / "config.yaml")
    (run / "run.json").write_text(json.dumps({"method": "cer"}))
    shutil.copytree(task / "model", run / "checkpoints" / "step_1")
    (run / "checkpoints" / "step_1" / "COMPLETE").write_text("")
    out = tmp_path / "eval"
    report = evaluate_all([run], out, subprocess_evaluator(ranks=2), resamples=100, plots=False)
    assert report["runs"][0]["problem"] is None, report["runs"]
    (record,) = out.glob("cache/*/record.json")
    record = json.loads(record.read_text())
    assert record["ranks"] == 2
    rows = record["benchmarks"]["tiny_test"]["rows"]
    expected = [json.loads(line)["id"] for line in (task / "test.jsonl").read_text().splitlines()]
    # ids as load_problems names them (file:id), in the file's order, each once
    assert [r["id"] for r in rows] == [f"test:{i}" for i in expected] and len(rows) == 5
    assert all(r["avg@k"] in (0.0, 0.5, 1.0) and r["greedy"] in (0.0, 1.0) for r in rows)
