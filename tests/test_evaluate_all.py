"""experiments.evaluate_all: discovery and method recognition on hand-made run folders, the table and
the paired intervals against hand-computed values, the cache, a failing evaluator subprocess."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from arco.config import ArcoConfig
from cer.config import CERConfig
from common.config import dump_config, load_config
from common.search_grpo import GRPOAssetsConfig, GRPOConfig
from common.warmup import WarmupConfig
from eviback.config import EviBackConfig
from experiments.evaluate_all import (
    COLUMNS,
    RetrievalServers,
    bootstrap_interval,
    discover,
    evaluate_all,
    load_published,
    load_run,
    main,
    metric_value,
    probing_retrieval,
    recognise,
    subprocess_evaluator,
)
from experiments.evaluate_plots import benchmark_bars

ROOT = Path(__file__).resolve().parent.parent


def _checkpoint(run: Path, step: int) -> Path:
    ckpt = run / "checkpoints" / f"step_{step}"
    (ckpt / "state").mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_text(f"weights of step {step}")
    (ckpt / "COMPLETE").write_text("")
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    return ckpt


def _runs(tmp: Path) -> Path:
    """A runs/ folder: one run per method (checkpoints are stand-in files), a broken config, an
    unknown one, a run without a checkpoint, and folders that are not runs."""
    runs = tmp / "runs"
    world = tmp / "world"
    world.mkdir()
    (world / "test.jsonl").write_text('{"id": "q1"}\n')
    ws = runs / "warmup" / "tiny"
    dump_config(WarmupConfig(world=str(world), out=str(ws)), ws / "config.yaml")
    (ws / "model").mkdir()
    (ws / "model" / "config.json").write_text("{}")
    for name, seed in (("grpo/s0", 0), ("grpo/s1", 1)):
        run = runs / name
        dump_config(
            GRPOConfig(
                assets=GRPOAssetsConfig(world=str(world), model=str(ws / "model")),
                run_dir=str(run),
                seed=seed,
            ),
            run / "config.yaml",
        )
        _checkpoint(run, 30)
    for name, overrides in (("eviback/tiny", []), ("eviback/base", ["teacher.enabled=false"])):
        cfg = load_config(EviBackConfig, ROOT / "eviback/configs/tiny.yaml", overrides)
        dump_config(cfg, runs / name / "config.yaml")
        _checkpoint(runs / name, 30)
    for reward in ("exact", "cer"):
        cfg = load_config(CERConfig, ROOT / "cer/configs/tiny.yaml", [f"reward.type={reward}"])
        dump_config(cfg, runs / "cer" / reward / "config.yaml")
        _checkpoint(runs / "cer" / reward, 30)
    cer_warm = runs / "cer" / "warmup"
    dump_config(load_config(CERConfig, ROOT / "cer/configs/tiny.yaml"), cer_warm / "config.yaml")
    (cer_warm / "model").mkdir()
    (cer_warm / "model" / "config.json").write_text("{}")
    arco = (
        ("arco/tiny", []),
        ("arco/outcome", ["method=outcome_only"]),
        ("arco/prm", ["method=prm"]),
    )
    for name, overrides in arco:
        cfg = load_config(ArcoConfig, ROOT / "arco/configs/tiny.yaml", overrides)
        dump_config(cfg, runs / name / "config.yaml")
        _checkpoint(runs / name, 8)
    (runs / "broken").mkdir()
    (runs / "broken" / "config.yaml").write_text("steps: [1, 2\n")
    (runs / "other").mkdir()
    (runs / "other" / "config.yaml").write_text("foo: 1\n")
    untrained = runs / "grpo" / "untrained"
    dump_config(
        GRPOConfig(assets=GRPOAssetsConfig(world=str(world)), run_dir=str(untrained)),
        untrained / "config.yaml",
    )
    (runs / "tinyworld").mkdir()  # no config.yaml: not a run
    return runs


def test_discovery_and_recognition(tmp_path):
    runs = _runs(tmp_path)
    found = discover([runs])
    assert all("checkpoints" not in p.parts for p in found)
    by_name = {r.name: r for r in (load_run(p, runs) for p in found)}
    assert {n: r.arm for n, r in by_name.items()} == {
        "arco/outcome": "arco_outcome_only",
        "arco/prm": "arco_prm",
        "arco/tiny": "arco",
        "broken": None,
        "cer/cer": "cer/cer",
        "cer/exact": "cer/exact",
        "cer/warmup": "cer_warmup",
        "eviback/base": "search_r1",
        "eviback/tiny": "eviback",
        "grpo/s0": "grpo",
        "grpo/s1": "grpo",
        "grpo/untrained": "grpo",
        "other": None,
        "warmup/tiny": "warmup",
    }
    assert by_name["broken"].problem.startswith("config.yaml unreadable")
    assert "matches no trainer" in by_name["other"].problem
    assert "no complete checkpoint" in by_name["grpo/untrained"].problem
    assert by_name["grpo/s0"].model == runs / "grpo/s0/checkpoints/step_30"
    assert by_name["warmup/tiny"].model == runs / "warmup/tiny/model"
    assert by_name["cer/warmup"].model == runs / "cer/warmup/model"
    assert sum(r.problem is None for r in by_name.values()) == 11
    # a chosen step that is not there is a reason, not a crash
    chosen = load_run(runs / "grpo/s0", runs, step=10)
    assert chosen.model is None and "step_10" in chosen.problem


@pytest.mark.parametrize(
    ("reward", "arm"),
    [
        ({"type": "rule"}, "cer/rule"),
        ({"type": "cer", "fn": ""}, "cer/cer"),
        ({"type": "cer", "fn": "f1"}, "cer/f1"),
        ({"type": "exact", "fn": "mypkg.rewards:LengthPenalty"}, "cer/LengthPenalty"),
    ],
)
def test_a_cer_run_is_labelled_by_its_reward_fn_when_one_replaces_the_type(reward, arm, tmp_path):
    config = {"reward": reward, "group_size": 8, "assets": {"eval": {"dev": "dev.jsonl"}}}
    assert recognise(config, tmp_path) == ("cer", arm)


def test_run_json_names_the_trainer_and_the_guesses_without_it_are_counted(tmp_path):
    runs = _runs(tmp_path)
    # a CER run with a model/ folder and no checkpoint looks like a warmup by its keys alone
    (runs / "cer" / "exact" / "model").mkdir()
    shutil.rmtree(runs / "cer" / "exact" / "checkpoints")
    (runs / "cer" / "exact" / "run.json").write_text(json.dumps({"method": "cer"}))
    (runs / "grpo" / "s1" / "run.json").write_text(json.dumps({"method": "sft"}))
    by_name = {r.name: r for r in (load_run(p, runs) for p in discover([runs]))}
    exact = by_name["cer/exact"]
    assert (exact.arm, exact.guessed) == ("cer/exact", False)
    assert "no complete checkpoint" in exact.problem
    assert (
        "run.json: method 'sft' is none of grpo, eviback, cer, arco" in by_name["grpo/s1"].problem
    )
    # the other trainers' runs have no run.json (written before it); warmups never have one
    assert sorted(n for n, r in by_name.items() if r.guessed) == [
        "arco/outcome", "arco/prm", "arco/tiny", "cer/cer", "eviback/base", "eviback/tiny",
        "grpo/s0", "grpo/untrained",
    ]  # fmt: skip


# per-question rows of the fake evaluations: (em, f1, valid, searches, duplicates, forced)
EVIBACK = [(1, 1.0, 1, 2, 1, 0), (0, 0.5, 1, 1, 0, 0), (1, 1.0, 1, 3, 1, 0), (0, 0.0, 0, 0, 0, 1)]
BASELINE = [(0, 0.0, 1, 1, 0, 0), (0, 0.5, 1, 1, 0, 0), (1, 1.0, 1, 1, 0, 0), (0, 0.0, 0, 0, 0, 1)]


def _rows(table):
    keys = ("em", "f1", "valid", "searches", "duplicates", "forced")
    return [{"id": f"q{i}", **dict(zip(keys, row, strict=True))} for i, row in enumerate(table)]


class FakeEvaluator:
    """Writes a record as the worker does, with hand-made rows; counts its calls."""

    def __init__(self):
        self.calls: list[str] = []

    def __call__(self, run, folder: Path) -> None:
        self.calls.append(run.name)
        if run.kind == "cer":
            rows = [{"id": f"p{i}", "greedy": float(i % 2), "avg@k": i / 4} for i in range(4)]
        elif run.arm == "search_r1":
            rows = _rows(BASELINE)
        else:
            rows = _rows(EVIBACK)
        if run.kind in ("search", "arco"):
            for r in rows:
                r.pop("duplicates")
        if run.name == "arco/tiny":
            (folder / "error.txt").write_text("FileNotFoundError: assets.corpus: x not found\n")
            return
        bench = {
            "file": "f",
            "digest": "d1",
            "rows": rows,
            **({"k": 4} if run.kind == "cer" else {}),
        }
        record = {"method": run.method, "model": str(run.model), "benchmarks": {"tiny_test": bench}}
        (folder / "record.json").write_text(json.dumps(record))


def test_table_intervals_paired_and_cache(tmp_path, capsys):
    runs, out = _runs(tmp_path), tmp_path / "eval"
    fake = FakeEvaluator()
    report = evaluate_all([runs], out, fake, resamples=4000, project_root=ROOT, plots=False)
    assert len(fake.calls) == 11
    by_run = {r["run"]: r for r in report["runs"]}
    ev = by_run["eviback/tiny"]["benchmarks"]["tiny_test"]
    m = {k: v["value"] for k, v in ev["metrics"].items()}
    assert ev["n"] == 4
    assert m == pytest.approx(
        {
            "f1": 0.625,
            "em": 0.5,
            "valid_answer_rate": 0.75,
            "mean_searches": 1.5,
            "duplicate_query_rate": 2 / 6,
            "forced_termination_rate": 0.25,
        }
    )
    # EM of [1, 0, 1, 0]: all-zero and all-one draws each have probability 1/16 > 2.5%
    assert (ev["metrics"]["em"]["ci_low"], ev["metrics"]["em"]["ci_high"]) == (0.0, 1.0)
    # the failed evaluation is listed with its reason; the others went on
    assert "assets.corpus: x not found" in by_run["arco/tiny"]["problem"]
    assert "benchmarks" not in by_run["arco/tiny"]
    pairs = {(c["run"], c["baseline"], c["metric"]): c for c in report["comparisons"]}
    # EviBack − Search-R1 per question: EM [1, 0, 0, 0], F1 [1, 0, 0, 0]
    em = pairs[("eviback/tiny", "eviback/base", "em")]
    assert em["delta"] == 0.25 and em["n"] == 4
    # P(mean of 4 draws ≥ 0.75) = 4·(1/4)³·(3/4) + (1/4)⁴ = 0.051 > 2.5%, P(all 0) = 0.32
    assert (em["ci_low"], em["ci_high"]) == (0.0, 0.75)
    # GRPO against the warmup it started from (same fake rows: Δ = 0 exactly)
    g = pairs[("grpo/s1", "warmup/tiny", "em")]
    assert g["delta"] == g["ci_low"] == g["ci_high"] == 0.0
    assert ("cer/cer", "cer/exact", "greedy") in pairs
    assert not any(
        c["run"] in ("cer/exact", "eviback/base", "arco/outcome") for c in pairs.values()
    )
    text = (out / "results.md").read_text()
    assert "| eviback/tiny | eviback | tiny_test | 4 | 0.625 [" in text
    assert (
        "| eviback/tiny | eviback/base | tiny_test | em | 4 | +0.250 | [+0.000, +0.750] |" in text
    )
    assert "not evaluated: config.yaml unreadable" in text
    saved = json.loads((out / "results.json").read_text())
    assert saved["comparisons"] == json.loads(json.dumps(report["comparisons"]))
    # published numbers sit in their own section, after every measured table
    if report["published"]:
        assert text.index("## Published") > text.index("## Against the baseline")

    # a second call evaluates nothing new (the failed run is tried again)
    fake.calls.clear()
    evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    assert fake.calls == ["arco/tiny"]
    assert "cached" in capsys.readouterr().out
    # a new checkpoint of one run is a new evaluation; a config change too
    _checkpoint(runs / "grpo" / "s0", 40)
    cfg = yaml.safe_load((runs / "cer/cer/config.yaml").read_text())
    cfg["eval"]["k"] = 2
    (runs / "cer/cer/config.yaml").write_text(yaml.safe_dump(cfg))
    fake.calls.clear()
    evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    assert sorted(fake.calls) == ["arco/tiny", "cer/cer", "grpo/s0"]


def test_pairing_needs_the_same_questions(tmp_path):
    runs, out = _runs(tmp_path), tmp_path / "eval"

    class Shifted(FakeEvaluator):
        def __call__(self, run, folder):
            super().__call__(run, folder)
            if run.arm == "search_r1":  # another question set: no paired interval
                record = json.loads((folder / "record.json").read_text())
                record["benchmarks"]["tiny_test"]["rows"][0]["id"] = "other"
                (folder / "record.json").write_text(json.dumps(record))

    report = evaluate_all([runs], out, Shifted(), resamples=200, project_root=ROOT, plots=False)
    assert not any(c["run"] == "eviback/tiny" for c in report["comparisons"])


def test_bootstrap_interval_hand_values():
    rows = [{"em": v} for v in [0.0, 1.0] * 50]
    assert metric_value(rows, "em") == 0.5
    lo, hi = bootstrap_interval(rows, "em", resamples=4000)
    # normal approximation: 0.5 ± 1.96·sqrt(0.25/100) = 0.5 ± 0.098
    assert lo == pytest.approx(0.402, abs=0.02) and hi == pytest.approx(0.598, abs=0.02)
    ratio = [{"duplicates": d, "searches": s} for d, s in [(1, 2), (0, 0), (1, 1)]]
    assert metric_value(ratio, "duplicate_query_rate") == pytest.approx(2 / 3)
    lo, hi = bootstrap_interval(ratio, "duplicate_query_rate", resamples=2000)
    assert 0.0 <= lo <= 2 / 3 <= hi <= 1.0


@pytest.mark.slow
def test_missing_assets_in_the_real_evaluator_are_listed(tmp_path):
    """ARCO's own evaluator, in its subprocess, refuses a run whose corpus is gone; the run is
    listed with the evaluator's message and the report is still written."""
    runs, out = tmp_path / "runs", tmp_path / "eval"
    cfg = load_config(
        ArcoConfig, ROOT / "arco/configs/tiny.yaml", [f"assets.corpus={tmp_path / 'gone.jsonl'}"]
    )
    dump_config(cfg, runs / "arco" / "config.yaml")
    _checkpoint(runs / "arco", 8)
    report = evaluate_all(
        [runs], out, subprocess_evaluator(), resamples=200, project_root=ROOT, plots=False
    )
    (row,) = report["runs"]
    assert row["problem"].startswith("evaluation failed:") and "gone.jsonl" in row["problem"]
    assert "gone.jsonl" in (out / "results.md").read_text()


def test_cli_usage_and_bad_folder(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "usage: python -m experiments.evaluate_all" in capsys.readouterr().out
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "eval")]) == 2
    assert "nowhere: no such folder" in capsys.readouterr().err


def test_published_tables_are_whole_and_matched_only_on_the_same_setting(tmp_path):
    published = load_published(ROOT)
    assert set(published) == {"arco", "cer", "eviback"}
    for doc in published.values():
        for table in doc["tables"]:
            assert table["source"] and table["rows"]
            assert all(len(v) == len(table["columns"]) for v in table["rows"].values())
    # a 1.7B EviBack run evaluated on NQ sits beside the paper's 0.399; its tiny twin does not
    runs = tmp_path / "runs"
    for name, config in (("paper", "qwen3_1.7b.yaml"), ("tiny", "tiny.yaml")):
        cfg = load_config(EviBackConfig, ROOT / "eviback/configs" / config)
        dump_config(cfg, runs / name / "config.yaml")
        _checkpoint(runs / name, 79)

    def evaluator(run, folder):
        rows = [{"id": "q0", "em": 1, "f1": 0.5, "valid": 1, "searches": 1, "duplicates": 0,
                 "forced": 0}]  # fmt: skip
        record = {"benchmarks": {"nq": {"file": "f", "digest": "d", "rows": rows}}}
        (folder / "record.json").write_text(json.dumps(record))

    report = evaluate_all([runs], tmp_path / "eval", evaluator, resamples=100,
                          project_root=ROOT, plots=False)  # fmt: skip
    (match,) = report["beside_published"]
    assert (match["run"], match["benchmark"], match["metric"]) == ("paper", "nq", "f1")
    assert match["published"] == 0.399 and match["measured"]["value"] == 0.5
    text = (tmp_path / "eval" / "results.md").read_text()
    assert "| paper | nq | f1 | 0.500 [0.500, 0.500] | 0.399 (published) |" in text


@pytest.mark.slow
def test_a_real_grpo_run_is_evaluated_once(tmp_path, tiny_world):
    """The workers in their subprocesses: a GRPO run folder over 12 test questions of the tiny
    world and an EviBack one over 5 (checkpoints: the world's model), real vLLM engines and BM25;
    the second call reads the cache."""
    world = tmp_path / "world"
    world.mkdir()
    lines = (Path(tiny_world) / "test.jsonl").read_text().splitlines()[:12]
    (world / "test.jsonl").write_text("\n".join(lines) + "\n")
    (world / "corpus.jsonl").symlink_to(Path(tiny_world) / "corpus.jsonl")
    run = tmp_path / "runs" / "grpo"
    cfg = load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml",
                      [f"assets.world={world}", f"run_dir={run}", "assets.model=''"])  # fmt: skip
    dump_config(cfg, run / "config.yaml")
    evi = tmp_path / "runs" / "eviback"
    cfg = load_config(EviBackConfig, ROOT / "eviback/configs/tiny.yaml",
                      [f"run_dir={evi}", f"assets.corpus={world / 'corpus.jsonl'}",
                       f"assets.eval={{tiny_test: {world / 'test.jsonl'}}}",
                       "assets.eval_quotas={tiny_test: 5}"])  # fmt: skip
    dump_config(cfg, evi / "config.yaml")
    for folder in (run, evi):
        ckpt = folder / "checkpoints" / "step_1"
        shutil.copytree(Path(tiny_world) / "model", ckpt)
        (ckpt / "COMPLETE").write_text("")
    out = tmp_path / "eval"
    report = evaluate_all([tmp_path / "runs"], out, subprocess_evaluator(), resamples=200,
                          project_root=ROOT, plots=False)  # fmt: skip
    evi_row, row = report["runs"]
    assert row["problem"] is None and evi_row["problem"] is None, report["runs"]
    # EviBack's own evaluator: its quota of 5 questions, named by the benchmark
    evi_bench = evi_row["benchmarks"]["tiny_test"]
    assert evi_bench["n"] == 5 and set(evi_bench["metrics"]) == set(COLUMNS["eviback"])
    bench = row["benchmarks"]["tiny_test"]
    (record_file,) = out.glob("cache/*_runs_grpo-*/record.json")
    rows = json.loads(record_file.read_text())["benchmarks"]["tiny_test"]["rows"]
    assert bench["n"] == 12 == len(rows)
    # load_qa names each question by its file: test:<id>, in the file's order
    assert [r["id"] for r in rows] == [f"test:{json.loads(line)['id']}" for line in lines]
    assert bench["metrics"]["em"]["value"] == pytest.approx(sum(r["em"] for r in rows) / 12)
    again = evaluate_all([tmp_path / "runs"], out, _refuse, resamples=200, project_root=ROOT,
                         plots=False)  # fmt: skip
    assert [r["benchmarks"] for r in again["runs"]] == [r["benchmarks"] for r in report["runs"]]
    # under the launcher: two ranks shard the 12 questions and give the same rows, in order
    two = evaluate_all([run], tmp_path / "eval2", subprocess_evaluator(ranks=2), resamples=200,
                       project_root=ROOT, plots=False)  # fmt: skip
    assert two["runs"][0]["problem"] is None, two["runs"]
    (record_two,) = (tmp_path / "eval2").glob("cache/*/record.json")
    record_two = json.loads(record_two.read_text())
    assert json.loads(record_file.read_text())["ranks"] == 1 and record_two["ranks"] == 2
    assert record_two["benchmarks"]["tiny_test"]["rows"] == rows


def _refuse(run, folder):
    raise AssertionError(f"{run.name} evaluated again")


def test_plots_bars_per_benchmark_and_curves_on_one_page(tmp_path):
    runs, out = _runs(tmp_path), tmp_path / "eval"
    rows = [{"step": 0, "dev/em": 0.1}, {"step": 10, "dev/em": 0.3}, {"step": 10, "loss": 1.0}]
    (runs / "grpo/s0/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = evaluate_all([runs], out, FakeEvaluator(), resamples=200, project_root=ROOT)
    bars = benchmark_bars(report)["tiny_test"]
    # the headline metrics of each kind; ARCO's failed run has no bar
    assert set(bars) == {"em", "f1", "greedy", "avg@k"}
    assert [b[0] for b in bars["greedy"]] == ["cer/cer", "cer/exact", "cer/warmup"]
    assert ("eviback/tiny", 0.5, 0.0, 1.0) in bars["em"]
    assert (out / "bench_tiny_test.png").stat().st_size > 0
    assert (out / "curves.png").stat().st_size > 0


def test_an_unreadable_cache_record_is_a_miss_evaluated_again(tmp_path, capsys):
    runs, out = _runs(tmp_path), tmp_path / "eval"
    fake = FakeEvaluator()
    evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    (record,) = out.glob("cache/*eviback_tiny-*/record.json")
    record.write_text(record.read_text()[:40])  # a write cut short: "Unterminated string ..."
    (other,) = out.glob("cache/*cer_cer-*/record.json")
    other.write_text('{"benchmarks": 5}')  # JSON, but not a record
    fake.calls.clear()
    capsys.readouterr()
    report = evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    assert sorted(fake.calls) == ["arco/tiny", "cer/cer", "eviback/tiny"]
    printed = capsys.readouterr().out
    assert f"cached {record} unreadable (JSONDecodeError: Unterminated string" in printed
    assert f"cached {other} unreadable (no `benchmarks` mapping)" in printed
    assert "2 unreadable cache record(s) evaluated again" in printed
    by_run = {r["run"]: r for r in report["runs"]}
    assert "benchmarks" in by_run["eviback/tiny"] and "benchmarks" in by_run["cer/cer"]
    assert by_run["eviback/tiny"]["notes"][0].startswith(f"cached {record} unreadable")
    assert report["unreadable_cache_records"] == 2
    assert f"| evaluated; cached {record} unreadable" in (out / "results.md").read_text()
    # the record written again is read from the cache the next time
    fake.calls.clear()
    evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    assert fake.calls == ["arco/tiny"]


@pytest.mark.parametrize(
    ("run", "key", "value"),
    [
        ("arco/tiny", "rl", 5),
        ("cer/cer", "reward", 5),
        ("eviback/tiny", "teacher", "on"),
        ("eviback/base", "assets", [1]),
        ("arco/prm", "method", ["prm"]),
    ],
)
def test_a_malformed_section_lists_the_run_and_goes_on(tmp_path, run, key, value):
    runs, out = _runs(tmp_path), tmp_path / "eval"
    config = yaml.safe_load((runs / run / "config.yaml").read_text())
    config[key] = value
    (runs / run / "config.yaml").write_text(yaml.safe_dump(config))
    fake = FakeEvaluator()
    report = evaluate_all([runs], out, fake, resamples=200, project_root=ROOT, plots=False)
    by_run = {r["run"]: r for r in report["runs"]}
    assert by_run[run]["problem"].startswith(f"config.yaml: `{key}` must be")
    assert run not in fake.calls and len(fake.calls) == 10  # every other run was evaluated
    assert (
        f"| {run} | ? |  | not evaluated: config.yaml: `{key}` must be"
        in (out / "results.md").read_text()
    )


def test_mean_over_benchmarks_weighs_each_benchmark_once():
    from experiments.evaluate_all import mean_over_benchmarks

    rows = [[{"a": 1}, {"a": 0}], [{"a": 1}, {"a": 1}, {"a": 1}, {"a": 0}]]
    got = mean_over_benchmarks(rows, "a", resamples=2000)
    assert got["value"] == 0.625  # (0.5 + 0.75) / 2, not 4 / 6
    assert got["ci_low"] < 0.625 < got["ci_high"]
    constant = mean_over_benchmarks([[{"a": 1}], [{"a": 0}, {"a": 0}]], "a", resamples=100)
    assert constant == {"value": 0.5, "ci_low": 0.5, "ci_high": 0.5}


class SixBenchmarks:
    """A CER evaluator's records over the paper's six benchmarks: benchmark b's question i is
    right in a share (i + b) % 3 / 2 of its samples."""

    def __call__(self, run, folder: Path) -> None:
        from experiments.evaluate_all import CER_SIX

        shift = {"cer/cer": 2, "cer/rule": 1, "cer/exact": 0}[run.arm]
        benchmarks = {
            name: {
                "file": f"{name}.jsonl",
                "digest": name,
                "k": 2,
                "rows": [
                    {
                        "id": f"{name}{i}",
                        "greedy": float((i + shift) % 2),
                        "avg@k": ((i + b + shift) % 3) / 2,
                    }
                    for i in range(3)
                ],  # fmt: skip
            }
            for b, name in enumerate(CER_SIX)
        }
        record = {"method": run.method, "model": str(run.model), "benchmarks": benchmarks}
        (folder / "record.json").write_text(json.dumps(record))


def test_cer_is_paired_with_rule_and_exact_and_its_mean_of_six_sits_beside_the_papers(tmp_path):
    runs = tmp_path / "runs"
    for reward in ("cer", "rule", "exact"):
        overrides = [f"reward.type={reward}", "assets.model=Qwen/Qwen3-4B-Base"]
        cfg = load_config(CERConfig, ROOT / "cer/configs/tiny.yaml", overrides)
        dump_config(cfg, runs / reward / "config.yaml")
        (runs / reward / "run.json").write_text(json.dumps({"method": "cer"}))
        _checkpoint(runs / reward, 10)
    report = evaluate_all([runs], tmp_path / "eval", SixBenchmarks(), resamples=500,
                          project_root=ROOT, plots=False)  # fmt: skip
    pairs = {(c["run"], c["baseline"]) for c in report["comparisons"]}
    assert pairs == {("cer", "rule"), ("cer", "exact"), ("rule", "exact")}
    by_run = {r["run"]: r for r in report["runs"]}
    mean = by_run["cer"]["benchmarks"]["mean of 6"]
    # each benchmark's avg@k: the mean of ((i + b + 2) % 3) / 2 over i = 0..2 is 0.5 for every b
    assert mean["n"] == 18 and mean["metrics"]["avg@k"]["value"] == pytest.approx(0.5)
    beside = [b for b in report["beside_published"] if b["run"] == "cer"]
    assert [(b["benchmark"], b["metric"], b["published"]) for b in beside] == [
        ("mean of 6", "avg@k", 0.487)
    ]
    assert {b["run"] for b in report["beside_published"]} == {"cer", "rule"}


def test_a_search_run_whose_retrieval_server_is_down_is_listed_not_evaluated(tmp_path, free_port):
    runs = tmp_path / "runs"
    url = f"http://127.0.0.1:{free_port()}/retrieve"  # nothing listens there
    cfg = load_config(EviBackConfig, ROOT / "eviback/configs/tiny.yaml",
                      [f"assets.retrieval_url={url}"])  # fmt: skip
    dump_config(cfg, runs / "eviback" / "config.yaml")
    _checkpoint(runs / "eviback", 10)
    evaluator = probing_retrieval(subprocess_evaluator())
    report = evaluate_all([runs], tmp_path / "eval", evaluator, resamples=100, project_root=ROOT,
                          plots=False)  # fmt: skip
    (row,) = report["runs"]  # no engine started: the probe came first
    assert not list((tmp_path / "eval").glob("cache/*/eval.log"))
    why = "evaluation failed: its retrieval server does not answer ("
    assert row["problem"].startswith(why) and url in row["problem"]
    assert "make serve-retrieval" in row["problem"]


def test_a_down_loopback_retrieval_server_is_started_on_the_index_given_once_then_stopped(
    tmp_path, free_port
):
    """`eval-all --retrieval-index DIR`: two search runs on one loopback URL that nothing answers
    get one server on DIR, up before either is evaluated, stopped at the end; a missing index or
    a URL on another host is the run's one-line reason instead."""
    from common.retrieval.client import RetrievalError, probe_retrieval

    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    shutil.copy(ROOT / "tests/data/retrieval/wiki18_sample_corpus.jsonl", corpus)
    subprocess.run([sys.executable, "-m", "common.retrieval", "index", "--corpus", str(corpus),
                    "--out", str(index)], check=True, cwd=ROOT, capture_output=True)  # fmt: skip
    url = f"http://127.0.0.1:{free_port()}/retrieve"
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        cfg = load_config(EviBackConfig, ROOT / "eviback/configs/tiny.yaml",
                          [f"assets.retrieval_url={url}", f"run_dir={runs / name}"])  # fmt: skip
        dump_config(cfg, runs / name / "config.yaml")
        _checkpoint(runs / name, 10)
    seen = []

    def evaluator(run, folder):
        probe_retrieval(url)  # answers while the run is evaluated
        seen.append(run.path.name)

    servers = RetrievalServers(
        index, tmp_path / "eval", wait_s=120, args=["--bm25-backend", "numpy"]
    )
    try:
        evaluate_all([runs], tmp_path / "eval", probing_retrieval(evaluator, servers),
                     resamples=100, project_root=ROOT, plots=False)  # fmt: skip
        assert sorted(seen) == ["a", "b"] and list(servers.procs) == [url]
        assert (tmp_path / "eval" / f"retrieval-{url.split(':')[2].split('/')[0]}.log").is_file()
    finally:
        servers.close()
    with pytest.raises(RetrievalError):
        probe_retrieval(url)
    missing = RetrievalServers(tmp_path / "no_index", tmp_path / "eval")
    assert "make data-index" in missing.start(url, "its server does not answer")
    assert "not on this machine: start it on 10.1.2.3" in missing.start(
        "http://10.1.2.3:8000/retrieve", "its server does not answer"
    )
    assert not missing.procs


class ShortAnswers:
    """A CER evaluator's record on short free-form answers (SCALE=smol): question i's greedy
    answer is right by exact match for none, contained for i < 2 (cer) or i < 1 (rule)."""

    def __call__(self, run, folder: Path) -> None:
        contained = {"cer/cer": 2, "cer/rule": 1}[run.arm]
        rows = [
            {"id": f"q{i}", "greedy": 0.0, "avg@k": 0.0,
             "greedy_contains": float(i < contained), "greedy_f1": 0.5 * (i < contained)}
            for i in range(4)
        ]  # fmt: skip
        bench = {"file": "test.jsonl", "digest": "t", "k": 1, "rows": rows}
        record = {"method": run.method, "model": str(run.model),
                  "benchmarks": {"smol_test": bench}}  # fmt: skip
        (folder / "record.json").write_text(json.dumps(record))


def test_short_answer_runs_get_containment_and_f1_columns_paired_with_the_rule(tmp_path):
    runs = tmp_path / "runs"
    for reward in ("cer", "rule"):
        cfg = load_config(CERConfig, ROOT / "cer/configs/smol.yaml", [f"reward.type={reward}"])
        dump_config(cfg, runs / reward / "config.yaml")
        (runs / reward / "run.json").write_text(json.dumps({"method": "cer"}))
        _checkpoint(runs / reward, 10)
    report = evaluate_all([runs], tmp_path / "eval", ShortAnswers(), resamples=500,
                          project_root=ROOT, plots=False)  # fmt: skip
    by_run = {r["run"]: r["benchmarks"]["smol_test"]["metrics"] for r in report["runs"]}
    assert by_run["cer"]["greedy_containment"]["value"] == 0.5  # 2 of 4
    assert by_run["rule"]["greedy_f1"]["value"] == 0.125  # 0.5 for 1 of 4
    assert by_run["cer"]["greedy"]["value"] == 0.0
    (diff,) = [c for c in report["comparisons"] if c["metric"] == "greedy_containment"]
    assert (diff["run"], diff["baseline"]) == ("cer", "rule")
    assert diff["delta"] == pytest.approx(0.25) and diff["n"] == 4  # q1: 1 - 0; the rest: 0
    assert "greedy_containment" in (tmp_path / "eval" / "results.md").read_text()


def test_a_search_run_is_evaluated_on_the_test_split_beside_its_train_file():
    from experiments.evaluate_all import search_benchmark

    world = {"world": "w/seed0"}
    assert search_benchmark("grpo", {"assets": world}) == ("tiny_test", Path("w/seed0/test.jsonl"))
    assert search_benchmark("warmup", world) == ("tiny_test", Path("w/seed0/test.jsonl"))
    smol = "runs/smol/data/train.jsonl"
    expected = ("smol_test", Path("runs/smol/data/test.jsonl"))
    assert search_benchmark("grpo", {"assets": {**world, "train": smol}}) == expected
    assert search_benchmark("warmup", {**world, "train_data": smol}) == expected


@pytest.mark.parametrize(
    "config", ["cer/configs/smol.yaml", "arco/configs/smol.yaml", "eviback/configs/smol.yaml"]
)
def test_every_smol_config_names_its_test_split_as_the_search_runs_do(config):
    """eval-all pairs runs by benchmark name: a method's smol test split must carry the name a
    reference GRPO run or its warmup gets for the same file, or nothing pairs across them."""
    from experiments.evaluate_all import search_benchmark

    root = Path(__file__).resolve().parent.parent
    grpo = yaml.safe_load((root / "common/configs/grpo_smol.yaml").read_text())
    name, test = search_benchmark("grpo", grpo)
    evals = yaml.safe_load((root / config).read_text())["assets"]["eval"]
    assert evals == {name: str(test)}
