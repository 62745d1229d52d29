"""experiments.compare: the paired bootstrap, pairing over seeds, the report, the spec and the runner."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from experiments.compare import (
    DONE_MARKER,
    diffs_from_start,
    load_spec,
    main,
    paired_bootstrap,
    question_diffs,
    seed_noise,
    summarize,
    with_command_line,
)

# A stand-in trainer for the runner: writes step 0 and step 2 per-question results in which
# question q is right at the end when (q + seed) % 3 != 0 (at the start: never), and a
# metrics.jsonl with the matching dev/em rows.
FAKE_TRAINER = """
import json, sys
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:])
run, seed, bonus = Path(args["run_dir"]), int(args["seed"]), int(args.get("bonus", 0))
(run / "dev_results").mkdir(parents=True, exist_ok=True)
metrics = []
for step in (0, 2):
    rows = [{"id": f"q{q}", "em": float(step == 2 and ((q + seed) % 3 != 0 or bonus)),
             "f1": 0.0, "valid": True} for q in range(6)]
    (run / "dev_results" / f"step_{step:05d}.jsonl").write_text(
        "".join(json.dumps(r) + "\\n" for r in rows))
    metrics.append({"step": step, "dev/em": sum(r["em"] for r in rows) / 6})
(run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\\n" for m in metrics))
"""


def test_bootstrap_of_constant_differences_is_that_constant():
    out = paired_bootstrap([0.5] * 10, resamples=200)
    assert out["delta"] == out["ci_low"] == out["ci_high"] == 0.5
    assert out["p_le_0"] == 0.0 and out["mde"] == 0.0 and out["n"] == 10


def test_bootstrap_mde_is_2_8_standard_errors():
    # sd of [0, 1, 0, 1] = sqrt(1/3); SE = sd / 2
    out = paired_bootstrap([0.0, 1.0, 0.0, 1.0], resamples=200)
    assert out["delta"] == 0.5
    assert out["mde"] == pytest.approx(2.8 * math.sqrt(1 / 3) / 2)


def test_bootstrap_interval_covers_zero_for_symmetric_differences():
    out = paired_bootstrap([1.0, -1.0] * 100, resamples=2000)
    assert out["delta"] == 0.0
    assert out["ci_low"] < 0 < out["ci_high"]
    assert 0.4 < out["p_le_0"] < 0.7
    with pytest.raises(ValueError, match="no paired"):
        paired_bootstrap([])


def test_question_diffs_average_over_seeds_before_differencing():
    arm = [{"a": {"em": 1}, "b": {"em": 0}}, {"a": {"em": 1}, "b": {"em": 1}}]
    base = [{"a": {"em": 0}, "b": {"em": 0}}, {"a": {"em": 1}, "b": {"em": 0}}]
    assert question_diffs(arm, base, "em") == [0.5, 0.5]
    with pytest.raises(ValueError, match="same dev questions"):
        question_diffs(arm, [{"a": {"em": 0}}], "em")


def test_diffs_from_start_pair_each_seed_with_its_own_start():
    finals = [{"a": {"em": 1}, "b": {"em": 1}}, {"a": {"em": 0}, "b": {"em": 1}}]
    starts = [{"a": {"em": 0}, "b": {"em": 1}}, {"a": {"em": 0}, "b": {"em": 0}}]
    assert diffs_from_start(finals, starts, "em") == [0.5, 0.5]


def test_seed_noise_is_the_mde_of_two_arms_that_differ_only_by_seed():
    # q "a" right in one of 2 seeds (variance 0.5), "b" in both (0): mean variance 0.25, so two
    # arms averaged over 2 seeds differ at a question with variance 2 * 0.25 / 2 = 0.25, sd 0.5
    finals = [{"a": {"em": 1}, "b": {"em": 1}}, {"a": {"em": 0}, "b": {"em": 1}}]
    z = seed_noise(finals, "em")
    assert (z["seeds"], z["n"], z["sd"]) == (2, 2, 0.5)
    assert z["mde"] == pytest.approx(2.8 * 0.5 / math.sqrt(2))
    assert z["questions_per_point"] == pytest.approx((2.8 * 0.5 / 0.01) ** 2)
    assert seed_noise(finals[:1], "em") is None  # one seed: no spread to measure
    assert seed_noise([finals[0], finals[0]], "em")["mde"] == 0.0  # the seeds agree everywhere
    with pytest.raises(ValueError, match="same dev questions"):
        seed_noise([finals[0], {"a": {"em": 1}}], "em")


def _spec(tmp_path: Path, **extra) -> Path:
    spec = {
        "out": str(tmp_path / "cmp"),
        "seeds": [0, 1, 2],
        "baseline": "start",
        "arms": [
            {"name": "plain", "command": ["python", str(tmp_path / "fake.py")]},
            {"name": "bonus", "command": ["python", str(tmp_path / "fake.py")],
             "overrides": ["bonus=1"]},
        ],
        **extra,
    }  # fmt: skip
    (tmp_path / "fake.py").write_text(FAKE_TRAINER)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_runner_and_report_on_a_stand_in_trainer(tmp_path, capsys):
    spec_path = _spec(tmp_path)
    assert main(["--spec", str(spec_path)]) == 0
    out = tmp_path / "cmp"
    assert all(
        (out / a / f"s{s}" / DONE_MARKER).exists() for a in ("plain", "bonus") for s in (0, 1, 2)
    )
    summary = json.loads((out / "comparison.json").read_text())
    # plain: each seed gets 4 of 6 right at the end; every question is wrong in exactly one seed
    plain = summary["arms"]["plain"]
    assert plain["final_per_seed"] == pytest.approx([4 / 6] * 3)
    assert summary["comparisons"]["plain"]["delta"] == pytest.approx(2 / 3)
    assert summary["comparisons"]["bonus"]["delta"] == 1.0
    assert summary["arms"]["bonus"]["curve"]["mean"] == [0.0, 1.0]
    assert (out / "curves.png").stat().st_size > 0
    assert "| plain | 2 | 0.000 | 0.667 ± 0.000 |" in (out / "comparison.md").read_text()
    # every question right in 2 of 3 seeds: variance 1/3 each, sd of Δ sqrt(2 * (1/3) / 3)
    noise = plain["seed_noise"]
    assert noise["sd"] == pytest.approx(math.sqrt(2 / 9))
    assert noise["mde"] == pytest.approx(2.8 * math.sqrt(2 / 9) / math.sqrt(6))
    assert summary["arms"]["bonus"]["seed_noise"]["mde"] == 0.0  # right in every seed
    assert f"| plain | 3 | 6 | 0.471 | {noise['mde']:.3f} |" in (out / "comparison.md").read_text()

    # a second call runs nothing again; against an arm instead of the start
    capsys.readouterr()
    spec = yaml.safe_load(spec_path.read_text())
    spec["baseline"] = "plain"
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path)]) == 0
    assert capsys.readouterr().out.count("done before") == 6
    summary = json.loads((out / "comparison.json").read_text())
    assert list(summary["comparisons"]) == ["bonus"]
    assert summary["comparisons"]["bonus"]["delta"] == pytest.approx(1 / 3)


def test_a_failing_run_is_one_line_error(tmp_path, capsys):
    spec_path = _spec(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    spec["arms"][0]["command"] = [sys.executable, "-c", "raise SystemExit(3)"]
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path)]) == 2
    assert "plain seed 0 failed (exit 3)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"baseline": "nobody"}, "baseline `nobody` is not an arm"),
        ({"arms": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["x"]}]}, "repeat"),
        ({"arms": [{"name": "a"}]}, r"arms\[0\] needs"),
    ],
)
def test_bad_specs_name_the_key(tmp_path, change, message):
    spec_path = _spec(tmp_path)
    spec = {**yaml.safe_load(spec_path.read_text()), **change}
    spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=message):
        load_spec(spec_path)
    spec_path.write_text(yaml.safe_dump({"seeds": [0]}))
    with pytest.raises(ValueError, match="missing key `out`"):
        load_spec(spec_path)


def test_report_without_results_says_which_run(tmp_path):
    spec = load_spec(_spec(tmp_path))
    with pytest.raises(FileNotFoundError, match="plain/s0: no per-question dev results"):
        summarize(spec)


# A stand-in for a diagnostic run after training: logs one more metric at the final step.
FAKE_THEN = """
import json, sys
from pathlib import Path
args = dict(a.split("=", 1) for a in sys.argv[1:])
with (Path(args["run_dir"]) / "metrics.jsonl").open("a") as f:
    f.write(json.dumps({"step": 2, "diag/acc": 0.1 * int(args["seed"])}) + "\\n")
"""


def test_then_commands_and_extra_metrics(tmp_path):
    spec_path = _spec(tmp_path)
    (tmp_path / "then.py").write_text(FAKE_THEN)
    spec = yaml.safe_load(spec_path.read_text())
    spec["arms"][0]["then"] = [["python", str(tmp_path / "then.py")]]
    spec["extra_metrics"] = ["diag/acc"]
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path)]) == 0
    out = tmp_path / "cmp"
    summary = json.loads((out / "comparison.json").read_text())
    plain = summary["arms"]["plain"]["extras"]["diag/acc"]
    assert plain["per_seed"] == pytest.approx([0.0, 0.1, 0.2])
    assert plain["final"] == pytest.approx(0.1) and plain["curve"]["step"] == [2]
    assert summary["arms"]["bonus"]["extras"]["diag/acc"] is None  # never logged: a dash
    text = (out / "comparison.md").read_text()
    assert "| arm | diag/acc |" in text and "| plain | 0.100 |" in text and "| bonus | – |" in text
    assert (out / "curves_diag_acc.png").stat().st_size > 0
    spec["arms"][0]["then"] = ["python then.py"]
    spec_path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ValueError, match=r"arms\[0\]\.then must be a list of commands"):
        load_spec(spec_path)


def test_command_line_out_seeds_and_sets_make_a_smaller_comparison(tmp_path):
    spec_path = _spec(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    spec["arms"][0]["overrides"] = ["warm={out}/w"]
    spec_path.write_text(yaml.safe_dump(spec))
    small = with_command_line(load_spec(spec_path), str(tmp_path / "smoke"), [1], ["bonus=1"])
    assert small["out"] == str(tmp_path / "smoke") and small["seeds"] == [1]
    assert small["arms"][0]["overrides"] == [f"warm={tmp_path / 'smoke'}/w", "bonus=1"]
    assert small["arms"][1]["overrides"] == ["bonus=1", "bonus=1"]
    args = ["--spec", str(spec_path), "--out", str(tmp_path / "smoke"), "--seeds", "1"]
    assert main([*args, "--set", "bonus=1"]) == 0
    runs = sorted(p.relative_to(tmp_path / "smoke") for p in (tmp_path / "smoke").glob("*/s*"))
    assert runs == [Path("bonus/s1"), Path("plain/s1")]
    assert not (tmp_path / "cmp").exists()
    summary = json.loads((tmp_path / "smoke" / "comparison.json").read_text())
    assert summary["arms"]["plain"]["final_per_seed"] == [1.0]  # bonus=1 reached every arm


def test_arms_runs_and_reports_a_subset_with_the_baseline(tmp_path):
    spec_path = _spec(tmp_path, baseline="plain")
    spec = yaml.safe_load(spec_path.read_text())
    spec["arms"].append({"name": "third", "command": spec["arms"][0]["command"]})
    spec_path.write_text(yaml.safe_dump(spec))
    sub = with_command_line(load_spec(spec_path), None, [0], [], ["third"])
    assert [a["name"] for a in sub["arms"]] == ["plain", "third"]  # the spec's order
    with pytest.raises(ValueError, match="no arm named fourth"):
        with_command_line(load_spec(spec_path), None, None, [], ["fourth"])
    assert main(["--spec", str(spec_path), "--seeds", "0", "--arms", "third"]) == 0
    out = tmp_path / "cmp"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["plain", "third"]
    assert set(json.loads((out / "comparison.json").read_text())["arms"]) == {"plain", "third"}


def _ran(tmp_path: Path, **extra) -> tuple[Path, Path]:
    """The stand-in comparison run once (3 seeds, 2 arms); the spec and the output folder."""
    spec_path = _spec(tmp_path, **extra)
    assert main(["--spec", str(spec_path)]) == 0
    return spec_path, tmp_path / "cmp"


def test_report_only_reports_the_arms_and_seeds_present(tmp_path, capsys):
    spec_path, out = _ran(tmp_path, baseline="plain")
    shutil.rmtree(out / "bonus" / "s1")
    shutil.rmtree(out / "plain" / "s2" / "dev_results")
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only"]) == 0
    summary = json.loads((out / "comparison.json").read_text())
    bonus, plain = summary["arms"]["bonus"], summary["arms"]["plain"]
    assert (bonus["seeds_present"], bonus["seeds_missing"]) == ([0, 2], [1])
    assert (plain["seeds_present"], plain["seeds_missing"]) == ([0, 1], [2])
    assert [(m["arm"], m["seed"]) for m in summary["missing"]] == [("plain", 2), ("bonus", 1)]
    assert "bonus/s1: no per-question dev results at step 0" in summary["missing"][1]["why"]
    # paired over the seeds both have: seed 0 only; plain s0 misses q0 and q3, bonus none
    c = summary["comparisons"]["bonus"]
    assert c["seeds"] == [0] and c["delta"] == pytest.approx(2 / 6)
    assert bonus["final_per_seed"] == [1.0, 1.0]
    text = (out / "comparison.md").read_text()
    assert "Missing (no dev results at step 0): plain s2, bonus s1;" in text
    assert (
        "| bonus | s0 2, s2 2 | 0.000 | 1.000 ± 0.000 | s0 1.000, s2 1.000 | 1.00 | +0.333 (s0) |"
        in text
    )

    # against the start: each arm over its own seeds present
    spec = yaml.safe_load(spec_path.read_text())
    spec["baseline"] = "start"
    spec_path.write_text(yaml.safe_dump(spec))
    summary = summarize(load_spec(spec_path), resamples=200)
    assert summary["comparisons"]["bonus"]["seeds"] == [0, 2]
    assert summary["comparisons"]["plain"]["delta"] == pytest.approx(2 / 3)

    # an arm with no seed at all: listed as missing, the others still reported
    shutil.rmtree(out / "bonus")
    assert main(["--spec", str(spec_path), "--report-only"]) == 0
    summary = json.loads((out / "comparison.json").read_text())
    assert summary["arms"]["bonus"]["seeds_present"] == [] and "bonus" in summary["not_compared"]
    assert "| bonus | – | missing: no seed has results |" in (out / "comparison.md").read_text()
    # no run with results at all: one line naming the first run looked for
    shutil.rmtree(out / "plain")
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run has results yet:" in err and "plain/s0" in err


def test_metrics_jsonl_is_read_as_the_trainers_read_it(tmp_path, capsys):
    spec_path, out = _ran(tmp_path)
    metrics = out / "plain" / "s0" / "metrics.jsonl"
    with metrics.open("a") as f:
        f.write('{"step": 3, "dev/e')  # killed while writing: a torn last line
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3: dropped a torn last line"):
        assert main(["--spec", str(spec_path), "--report-only"]) == 0
    summary = json.loads((out / "comparison.json").read_text())
    assert summary["arms"]["plain"]["curve"]["step"] == [0, 2]
    # a bad line elsewhere: one line naming the file and the line
    lines = metrics.read_text().split("\n")
    metrics.write_text("\n".join([lines[0], "not json", *lines[1:]]))
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{metrics}:2: not a JSON line" in err


def test_unfinished_seeds_are_marked_with_their_own_step(tmp_path):
    spec_path, out = _ran(tmp_path)
    run = out / "bonus" / "s2"
    (run / DONE_MARKER).unlink()  # stopped (or still running) after its step-0 evaluation
    (run / "dev_results" / "step_00002.jsonl").unlink()
    assert main(["--spec", str(spec_path), "--report-only"]) == 0
    summary = json.loads((out / "comparison.json").read_text())
    bonus = summary["arms"]["bonus"]
    assert bonus["unfinished_seeds"] == [2] and bonus["final_step_per_seed"] == [2, 2, 0]
    assert bonus["final_step"] is None  # the seeds disagree
    assert [p["finished"] for p in bonus["per_seed"]] == [True, True, False]
    assert summary["unfinished"] == [{"arm": "bonus", "seed": 2, "final_step": 0}]
    assert summary["arms"]["plain"]["unfinished_seeds"] == []
    text = (out / "comparison.md").read_text()
    assert "| bonus | s0 2, s1 2, s2 0* |" in text and "s2 0.000*" in text
    assert "Unfinished (*: no `.compare_done`" in text and "bonus s2 (step 0)" in text
    assert "| plain | 2 | 0.000 | 0.667 ± 0.000 |" in text  # finished arms read as before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("out: x\nseeds: [0\n", r"not valid YAML \(line 3, column 1\): expected"),
        ("- out\n", "expected a mapping of keys"),
        ("out: x\nseeds: 0\narms: []\n", "`seeds` must be a list of integers"),
        ("out: x\nseeds: [0, 0]\narms: []\n", "`seeds` repeat"),
        ("out: x\nseeds: [0]\narms: 5\n", "`arms` must be a list of arms"),
        ("out: x\nseeds: [0]\narms: [5]\n", r"arms\[0\] needs `name` and `command`"),
        ("out: x\nseeds: [0]\narms: [{name: a, command: python x}]\n", r"arms\[0\].command"),
        ("out: x\nseeds: [0]\narms: [{name: a, command: [x], overrides: a=1}]\n", "overrides"),
        ("out: x\nseeds: [0]\nmetric: [em]\narms: [{name: a, command: [x]}]\n", "`metric`"),
        ("out: 5\nseeds: [0]\narms: [{name: a, command: [x]}]\n", "`out` must be a folder"),
        # an arm is a folder under `out`: its name cannot lead out of it
        (
            "out: x\nseeds: [0]\narms: [{name: ../../../x, command: [x]}]\n",
            r"arms\[0\]\.name: '\.\./\.\./\.\./x' cannot be a file or folder name \(it holds a "
            r"path separator\); name it with letters, digits, '\.', '_' and '-'$",
        ),
        ("out: x\nseeds: [0]\narms: [{name: .., command: [x]}]\n", r"'\.\.' cannot be a file"),
        ("out: x\nseeds: [0]\narms: [{name: 5, command: [x]}]\n", r"\(a name is text, not int\)"),
    ],
)
def test_spec_mistakes_are_one_line_naming_the_key(tmp_path, capsys, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_spec(path)
    assert main(["--spec", str(path), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ")
    assert main(["--spec", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: cannot read it" in capsys.readouterr().err


def test_an_arm_or_metric_that_would_leave_the_output_folder_writes_nothing(tmp_path, capsys):
    """``../../../x`` as an arm wrote a run outside ``out``; as ``--metric``, a report."""
    spec_path = _spec(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    spec["out"] = str(tmp_path / "a" / "b" / "cmp")
    spec["arms"][0]["name"] = "../../../x"
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {spec_path}: arms[0].name: '../../../x' cannot be a file or folder name (it "
        "holds a path separator); name it with letters, digits, '.', '_' and '-'\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fake.py", "spec.yaml"]
    assert main(["--spec", str(_spec(tmp_path)), "--metric", "../../y", "--report-only"]) == 2
    assert capsys.readouterr().err.startswith("error: --metric: '../../y' cannot be a file")


def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """``out`` under a file (as a read-only folder would, even as root): one line, exit 2."""
    (tmp_path / "afile").write_text("")
    spec_path = _spec(tmp_path)
    assert main(["--spec", str(spec_path), "--out", str(tmp_path / "afile" / "cmp")]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: cannot write {tmp_path / 'afile' / 'cmp' / 'plain' / 's0'}: a part of its path "
        "is a file, not a folder; remove or rename that file, or point run_dir (or the "
        "command's output folder) at another folder"
    )


def test_arms_without_a_baseline_key_compare_against_the_start(tmp_path):
    spec_path = _spec(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    del spec["baseline"]
    spec_path.write_text(yaml.safe_dump(spec))
    sub = with_command_line(load_spec(spec_path), None, [0], [], ["bonus"])
    assert [a["name"] for a in sub["arms"]] == ["bonus"]
    assert main(["--spec", str(spec_path), "--seeds", "0", "--arms", "bonus"]) == 0
    summary = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert list(summary["arms"]) == ["bonus"] and summary["comparisons"]["bonus"]["delta"] == 1.0


def test_a_metric_the_results_lack_names_the_file(tmp_path, capsys):
    spec_path, out = _ran(tmp_path)
    spec = yaml.safe_load(spec_path.read_text())
    spec["metric"] = "emm"
    spec_path.write_text(yaml.safe_dump(spec))
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "plain/s0/dev_results/step_00000.jsonl" in err
    assert "no `emm` field" in err


ROOT_DIR = Path(__file__).resolve().parent.parent
CONFIG_CLASSES = {
    "arco": "arco.config:ArcoConfig",
    "cer": "cer.config:CERConfig",
    "eviback": "eviback.config:EviBackConfig",
    "common.search_grpo": "common.search_grpo:GRPOConfig",
}


@pytest.mark.parametrize(
    "spec_path",
    sorted(ROOT_DIR.glob("*/configs/compare_*.yaml")),
    ids=lambda p: f"{p.parent.parent.name}/{p.name}",
)
def test_every_shipped_spec_loads_and_each_arm_s_settings_are_valid(spec_path):
    """A typo in an arm's overrides (a key or a value out of range) fails here, not an hour
    into `make compare-*`."""
    import importlib

    from common.config import load_config

    spec = load_spec(spec_path)
    for arm in spec["arms"]:
        cmd = arm["command"]
        module, config = cmd[cmd.index("-m") + 1], cmd[cmd.index("--config") + 1]
        mod, _, name = CONFIG_CLASSES[module].partition(":")
        cls = getattr(importlib.import_module(mod), name)
        overrides = [o.replace("{out}", "runs/x") for o in arm.get("overrides", [])]
        load_config(cls, ROOT_DIR / config, overrides)


def test_metric_reports_another_field_of_the_same_runs_beside_the_spec_metrics(tmp_path, capsys):
    spec_path = _spec(tmp_path)
    assert main(["--spec", str(spec_path)]) == 0
    out = tmp_path / "cmp"
    before = (out / "comparison.json").read_text()
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only", "--metric", "f1"]) == 0
    assert capsys.readouterr().out.endswith(
        f"wrote {out}/comparison_f1.md, comparison_f1.json, curves_f1.png\n"
    )
    by_f1 = json.loads((out / "comparison_f1.json").read_text())
    assert by_f1["metric"] == "f1"  # the stand-in's f1 is 0 everywhere: no difference
    assert by_f1["comparisons"]["plain"]["delta"] == by_f1["comparisons"]["bonus"]["delta"] == 0
    assert "dev f1 (greedy)" in (out / "comparison_f1.md").read_text()
    assert (out / "curves_f1.png").stat().st_size > 0
    assert (out / "comparison.json").read_text() == before  # the spec metric's report stays


def test_archive_keeps_the_results_a_report_needs_and_adds_later_seeds(tmp_path, capsys):
    spec_path, out = _ran(tmp_path, baseline="plain")
    want = json.loads((out / "comparison.json").read_text())
    # the archive holds seed 0 from an earlier session; this one ran seeds 1 and 2
    arch = tmp_path / "kept"
    assert main(["--spec", str(spec_path), "--report-only", "--seeds", "0", "--archive",
                 str(arch)]) == 0  # fmt: skip
    # a first archive gets the manifest `make results` reads (experiments.results), kept after
    manifest = yaml.safe_load((arch / "archive.yaml").read_text())
    assert manifest["spec"] == str(spec_path) and manifest["metrics"] == ["em"]
    assert manifest["command"] == f"python -m experiments.compare --spec {spec_path}"
    assert {"name", "title", "short", "commit"} <= set(manifest)
    (arch / "archive.yaml").write_text("name: edited\n")
    shutil.rmtree(out / "plain" / "s0")
    shutil.rmtree(out / "bonus" / "s0")
    (out / "plain" / "s1" / "compare.log").write_text("a log the archive leaves behind\n")
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only", "--archive", str(arch)]) == 0
    assert "archived 4 runs" in capsys.readouterr().out  # seeds 1 and 2 of two arms
    run = arch / "plain" / "s1"
    assert sorted(p.name for p in run.iterdir()) == sorted(["dev_results", "metrics.jsonl",
                                                            DONE_MARKER])  # fmt: skip
    assert sorted(p.name for p in (arch / "bonus" / "s0" / "dev_results").iterdir()) == [
        "step_00000.jsonl",
        "step_00002.jsonl",
    ]
    got = json.loads((arch / "comparison.json").read_text())  # seeds 0-2: the first report's
    assert got["comparisons"] == want["comparisons"]
    assert got["arms"]["bonus"]["final_per_seed"] == want["arms"]["bonus"]["final_per_seed"]
    assert (arch / "archive.yaml").read_text() == "name: edited\n"
    assert main(["--spec", str(spec_path), "--report-only", "--out", str(arch)]) == 0
    assert json.loads((arch / "comparison.json").read_text())["comparisons"] == want["comparisons"]
    # the comparison's own folder as the archive: one line, nothing copied onto itself
    capsys.readouterr()
    assert main(["--spec", str(spec_path), "--report-only", "--archive", str(out)]) == 2
    assert "is the comparison's own folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec_path", "baseline", "arms"),
    [
        ("eviback/configs/compare_smol.yaml", "search_r1", ["search_r1", "eviback"]),
        ("common/configs/compare_grpo_smol.yaml", "start", ["grpo"]),
    ],
)
def test_the_smol_search_agent_comparisons_make_one_pass_over_the_training_questions(
    spec_path, baseline, arms
):
    """37 steps of 4 questions: one pass over common.smol.data's 150 training questions (148
    of them), every arm the same smol config but for the teacher."""
    from common.config import load_config
    from common.smol.data import SIZES
    from eviback.config import EviBackConfig

    spec = load_spec(ROOT_DIR / spec_path)
    assert (spec["metric"], spec["baseline"], spec["seeds"]) == ("em", baseline, [0, 1, 2])
    assert [a["name"] for a in spec["arms"]] == arms
    for arm in spec["arms"]:
        config = arm["command"][arm["command"].index("--config") + 1]
        assert config.endswith("smol.yaml") and "steps=37" in arm["overrides"]
    if baseline == "search_r1":
        cfgs = [load_config(EviBackConfig, ROOT_DIR / config, a["overrides"]) for a in spec["arms"]]
        assert [c.teacher.enabled for c in cfgs] == [False, True]
        assert cfgs[0].steps == SIZES["train"] // cfgs[0].questions_per_step == 37


def test_the_smol_arco_comparison_gives_both_arms_one_budget_of_about_one_pass():
    """Outcome-only makes ARCO's steps as GRPO steps of as many trajectories; ARCO's questions
    (sparse x 4, dense x 16) come to about one pass over the 150 training questions."""
    from arco.config import ArcoConfig
    from common.config import load_config
    from common.smol.data import SIZES

    spec = load_spec(ROOT_DIR / "arco/configs/compare_smol.yaml")
    assert (spec["metric"], spec["baseline"]) == ("em", "outcome_only")
    outcome, arco = (
        load_config(ArcoConfig, ROOT_DIR / "arco/configs/smol.yaml", a["overrides"])
        for a in spec["arms"]
    )
    assert (outcome.method, arco.method) == ("outcome_only", "arco")
    assert outcome.steps == arco.steps == outcome.sparse_steps == arco.eval_every == 10
    rl = arco.rl
    questions = rl.sparse_steps * rl.sparse_questions + rl.dense_steps * rl.dense_questions
    assert 0.85 * SIZES["train"] <= questions <= SIZES["train"]
    assert rl.dense_questions == outcome.rl.sparse_questions * outcome.rl.sparse_n


def _write_run(run_dir: Path, finals: list[float]) -> None:
    """A finished run whose dev EM is 0 everywhere at step 0 and ``finals`` at step 2."""
    (run_dir / "dev_results").mkdir(parents=True)
    for step, values in ((0, [0.0] * len(finals)), (2, finals)):
        rows = [{"id": f"q{i}", "em": v} for i, v in enumerate(values)]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (run_dir / "dev_results" / f"step_{step:05d}.jsonl").write_text(text)
    (run_dir / DONE_MARKER).write_text("1 s\n")


def test_the_verdict_counts_seed_noise_and_only_its_interval_is_bold(tmp_path, capsys):
    # 40 questions; at seed 0 the arm is right on all of them and the reference on none, at
    # seeds 1 and 2 both are wrong everywhere. Pooled over seeds every question's Δ is 1/3, so
    # the interval over questions (seeds fixed) is [1/3, 1/3]; drawing the seeds too, no seed 0
    # is drawn with chance 8/27 (Δ* = 0) and three times with chance 1/27 (Δ* = 1): [0, 1]
    for seed in (0, 1, 2):
        _write_run(tmp_path / "cmp" / "arm" / f"s{seed}", [float(seed == 0)] * 40)
        _write_run(tmp_path / "cmp" / "ref" / f"s{seed}", [0.0] * 40)
    spec = {"out": str(tmp_path / "cmp"), "seeds": [0, 1, 2], "baseline": "ref",
            "arms": [{"name": "ref", "command": ["x"]}, {"name": "arm", "command": ["x"]}]}  # fmt: skip
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    assert main(["--spec", str(spec_path), "--report-only"]) == 0
    c = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["comparisons"]["arm"]
    assert c["n"] == 40 and c["delta"] == pytest.approx(1 / 3)
    assert (c["ci_low"], c["ci_high"]) == pytest.approx((1 / 3, 1 / 3))
    both = c["seeds_and_questions"]
    assert (both["ci_low"], both["ci_high"]) == (0.0, 1.0) and both["seeds"] == 3
    assert c["verdict"] == {"interval": "seeds_and_questions", "sign": 0}
    text = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "n = 40 dev questions" in text and "**" not in text
    assert "| +0.333 | [+0.333, +0.333] | 0.000 | [+0.000, +1.000] |" in text
    assert "across 0 (seeds + questions)" in text

    # one seed: the verdict uses the interval over questions, bold when clear of 0
    assert main(["--spec", str(spec_path), "--report-only", "--seeds", "0"]) == 0
    c = json.loads((tmp_path / "cmp" / "comparison.json").read_text())["comparisons"]["arm"]
    assert c["verdict"] == {"interval": "questions", "sign": 1}
    text = (tmp_path / "cmp" / "comparison.md").read_text()
    assert "| +1.000 | **[+1.000, +1.000]** | 0.000 | [+1.000, +1.000] |" in text
    assert "**above 0** (questions)" in text
