"""ARCO end to end on the tiny world: warmup (oracle teacher) -> co-evolution RL -> eval, with the
real vLLM engine serving both adapters; resume after an interruption; errors before any load."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from arco.cli import main
from arco.config import ArcoConfig
from arco.rubric_model import HEAD_FILE
from common.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"


def overrides(world: Path, out: Path, backend: str = "vllm") -> list[str]:
    """The tiny config shrunk to seconds: 8 questions played twice, 1 sparse + 1 dense step."""
    return [
        f"assets.model={world / 'model'}",
        f"assets.train={world / 'train.jsonl'}",
        f"assets.dev={world / 'dev.jsonl'}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"assets.eval={{tiny_test: {world / 'test.jsonl'}}}",
        f"warmup_dir={out / 'warmup'}",
        f"run_dir={out / 'run'}",
        f"engine.backend={backend}",
        "engine.kv_cache_mib=64",
        "lora.r=4",
        "lora.lora_alpha=8",
        "rubric.max_new_tokens=24",
        "warmup.questions=8",
        "warmup.samples=2",
        "warmup.select_questions=4",
        "warmup.pi_epochs=1",
        "warmup.mu_epochs=1",
        "warmup.pi_batch=4",
        "warmup.mu_batch=8",
        "rl.sparse_steps=1",
        "rl.dense_steps=1",
        "rl.sparse_questions=2",
        "rl.sparse_n=2",
        "rl.dense_questions=4",
        "rl.micro_batch_size=2",
        "eval_questions=4",
        "eval_every=100",
    ]


@pytest.fixture(scope="module")
def warmed(tiny_world, tmp_path_factory) -> Path:
    from arco.warmup import run_warmup

    out = tmp_path_factory.mktemp("arco")
    # RL's optimizer keys set apart from the warmup's (warmup.*), which the warmup trains with
    rl_keys = ["train.weight_decay=0.02", "train.max_grad_norm=0.5"]
    cfg = load_config(ArcoConfig, CONFIG, overrides(tiny_world, out) + rl_keys)
    run_warmup(cfg)
    assert (cfg.train.weight_decay, cfg.train.max_grad_norm) == (0.02, 0.5)  # not overwritten
    return out


@pytest.mark.slow
def test_warmup_writes_adapters_head_report_and_annotated_data(warmed):
    w = warmed / "warmup"
    for name in ("policy", "rubric", "policy_ref", "rubric_ref"):
        assert (w / "adapters" / name / "adapter_model.safetensors").is_file()
    assert (w / "rubric_head" / "head.safetensors").is_file() and json.loads(
        (w / "arco.json").read_text()
    )["k"] == 3
    report = json.loads((w / "report.json").read_text())
    assert report["counts"]["episodes"] == 16
    assert len(report["mu_sft"]["epochs"]) == 1
    rows = [json.loads(line) for line in (w / "data.jsonl").open()]
    assert len(rows) == 16
    for row in rows:  # every kept annotation meets Σ_t mean_k = R after projection
        if row["annotation"]:
            total = sum(sum(a["scores"]) / len(a["scores"]) for a in row["annotation"])
            assert total == pytest.approx(row["reward"], abs=1e-6)


def _fresh_process_rng(seed: int) -> None:
    """Random streams as a fresh ``arco warmup`` process may start with (its own seed differs
    from run to run): what the warmup leaves must not depend on them."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _warmup_outputs(w: Path) -> dict:
    """What a warmup leaves: every adapter and the head, bit for bit, the report but the
    collection's wall time, the annotated data and the logged losses."""
    from safetensors.torch import load_file

    files = sorted(w.glob("adapters/*/adapter_model.safetensors")) + [w / HEAD_FILE]
    report = json.loads((w / "report.json").read_text())
    report.pop("collect_s")
    return {
        "weights": {str(f.relative_to(w)): load_file(str(f)) for f in files},
        "report": report,
        "data": (w / "data.jsonl").read_text(),
        "metrics": [json.loads(line) for line in (w / "metrics.jsonl").open()],
    }


@pytest.mark.slow
def test_a_warmup_killed_in_mu_resumes_without_redoing_collection_and_pi(
    tiny_world, tmp_path, monkeypatch, capsys
):
    """Killed in μ's SFT: the rerun skips the collection and π (their results and markers are
    in warmup_dir/phases; neither is redone: they would fail here, their files keep their
    mtime) and ends with the warmup an uninterrupted run writes; a third run skips all."""
    from arco import warmup

    def config(out: Path, *more: str) -> ArcoConfig:
        return load_config(ArcoConfig, CONFIG, overrides(tiny_world, out, "hf") + list(more))

    real_filter = warmup.project_and_filter

    def every_one_for_pi(episodes, annotations, tol):  # the random tiny model never wins:
        _, mu, counts = real_filter(episodes, annotations, tol)  # π SFT on μ's, so it trains
        return mu, mu, counts

    monkeypatch.setattr(warmup, "project_and_filter", every_one_for_pi)
    _fresh_process_rng(1)
    straight = warmup.run_warmup(config(tmp_path / "straight"))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed in μ's SFT")

    out = tmp_path / "killed" / "warmup"
    with monkeypatch.context() as m:
        m.setattr(warmup, "sft_rubric", killed)
        _fresh_process_rng(2)
        with pytest.raises(KeyboardInterrupt):
            warmup.run_warmup(config(tmp_path / "killed"))
    phases = out / "phases"
    assert sorted(p.name for p in phases.iterdir()) == [
        "collect.done",
        "collect.json",
        "collect.safetensors",
        "pi.done",
        "pi.json",
        "pi.safetensors",
    ]
    assert not (out / "arco.json").exists()
    mtimes = {p.name: p.stat().st_mtime_ns for p in phases.iterdir()}

    def redone(*args, **kwargs):
        raise AssertionError("a finished phase ran again")

    capsys.readouterr()
    with monkeypatch.context() as m:
        for name in ("collect_oracle", "collect_llm", "sft_policy"):
            m.setattr(warmup, name, redone)
        torch.manual_seed(1)  # another process: what it resumes from is the saved state
        assert warmup.run_warmup(config(tmp_path / "killed")) == out
    printed = capsys.readouterr().out
    assert f"[arco warmup] collection phase done at {phases / 'collect.json'}, skipped" in printed
    assert f"[arco warmup] π phase done at {phases / 'pi.json'}, skipped" in printed
    assert {p.name: p.stat().st_mtime_ns for p in phases.iterdir() if p.name in mtimes} == mtimes
    assert (phases / "mu.done").is_file()

    want, got = _warmup_outputs(straight), _warmup_outputs(out)
    assert want["report"]["pi_sft"]["chosen_epoch"] == 1  # π trained, before the kill
    assert got["weights"].keys() == want["weights"].keys()
    for name, tensors in want["weights"].items():
        for key, t in tensors.items():
            assert torch.equal(got["weights"][name][key], t), (name, key)
    assert (got["report"], got["data"], got["metrics"]) == (
        want["report"],
        want["data"],
        want["metrics"],
    )

    # all three done: the next run loads nothing; RL-only keys are not the warmup's settings
    with monkeypatch.context() as m:
        m.setattr(warmup, "build_arco_model", redone)
        assert warmup.run_warmup(config(tmp_path / "killed", "rl.dense_steps=5")) == out
    printed = capsys.readouterr().out
    assert f"[arco warmup] μ phase done at {out}, skipped" in printed


def test_other_warmup_settings_run_every_phase_again(tmp_path, capsys):
    """The markers hold a hash of the settings the warmup reads: RL's keys, the folders and
    logging leave it; any warmup key changes it, and then no phase counts as done."""
    from arco.warmup import WarmupPhases, warmup_settings

    base = load_config(ArcoConfig, CONFIG, [])
    same = ["rl.dense_steps=3", "run_dir=elsewhere", "save_every=1", "train.max_grad_norm=0.5",
            # what the teacher's answers cost and where they are kept, not what they are
            "warmup.max_api_calls=7", "warmup.max_api_usd=2", "warmup.api_cache_dir=elsewhere",
            "warmup.player_usd_per_mtok=[0.15,0.6]", "warmup.annotator_usd_per_mtok=[2,8]"]  # fmt: skip
    assert warmup_settings(load_config(ArcoConfig, CONFIG, same)) == warmup_settings(base)
    for key in ("warmup.mu_epochs=3", "seed=1", "lora.r=4", "rubric.k=2", "assets.train=x.jsonl"):
        assert warmup_settings(load_config(ArcoConfig, CONFIG, [key])) != warmup_settings(base)

    (tmp_path / "arco.json").write_text("{}")
    phases = WarmupPhases(tmp_path, "aaaa")
    phases.finish("collect", {"x": 1})
    phases.finish("pi", {"y": 2})
    assert WarmupPhases(tmp_path, "aaaa").done == ["collect", "pi"]
    phases.finish("mu")
    assert WarmupPhases(tmp_path, "aaaa").done == ["collect", "pi", "mu"]
    (tmp_path / "phases" / "pi.json").unlink()  # a result gone: its phase and later ones run
    assert WarmupPhases(tmp_path, "aaaa").done == ["collect"]
    assert not (tmp_path / "phases" / "mu.done").exists()
    capsys.readouterr()
    assert WarmupPhases(tmp_path, "bbbb").done == []
    assert "other settings than the collection phase was done with" in capsys.readouterr().out
    assert not list((tmp_path / "phases").glob("*.done"))


@pytest.mark.slow
def test_train_logs_every_part_writes_readable_samples_and_evaluates(warmed, tiny_world):
    cfg = load_config(ArcoConfig, CONFIG, overrides(tiny_world, warmed))
    from arco.trainer import train_arco

    out = train_arco(cfg)
    run = Path(out["run_dir"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["phase_dense"] for r in steps] == [0.0, 1.0]
    for r in steps:
        for key in ("rollout", "rubric_generation", "pi_update", "mu_update", "push"):
            assert r[f"time/{key}"] > 0, key
        assert "time/scoring" not in r  # rl.mu_single_forward: μ's update forward scores
        assert 0.0 <= r["criteria_valid_rate"] <= 1.0
        assert r["decomposition_error"] >= 0.0
        assert any(k.startswith("step_score/terminal/") for k in r)
    assert steps[1]["pi_kl"] >= 0.0  # the dense phase pays KL(π‖π_ref)
    samples = json.loads((run / "samples" / "step_00002.json").read_text())
    step = samples[0]["steps"][0]
    assert {"action", "criteria", "scores", "step_score", "advantage"} <= set(step)
    assert len(step["scores"]) == 3
    ckpt = run / "checkpoints" / "step_2"
    assert (ckpt / "adapters" / "rubric" / "adapter_model.safetensors").is_file()
    assert (ckpt / "rubric_head" / "head.safetensors").is_file() and (
        ckpt / "config.json"
    ).is_file()
    # the checkpoint's merged HF model is the policy: base + policy adapter
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    model = out["model"].eval()
    with torch.no_grad():
        want, _ = model("policy", ids, mask)
        torch.testing.assert_close(merged(input_ids=ids, attention_mask=mask).logits, want)
    code = main(["eval", "--config", str(CONFIG), *overrides(tiny_world, warmed)])
    assert code == 0
    result = json.loads((run / "eval" / "results.json").read_text())["results"]["tiny_test"]
    assert result["questions"] == sum(1 for _ in (tiny_world / "test.jsonl").open())
    assert 0.0 <= result["em"] <= result["f1"] <= 1.0


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_weights(warmed, tiny_world, tmp_path):
    """HF engine (seeded per call): 1 step, then 1 more after a restart == 2 steps straight."""
    from arco.trainer import train_arco

    def run(run_dir: Path, dense: int, *more: str) -> dict:
        over = overrides(tiny_world, warmed, backend="hf") + [
            f"run_dir={run_dir}",
            f"rl.dense_steps={dense}",
            "save_every=1",
            *more,
        ]
        return train_arco(load_config(ArcoConfig, CONFIG, over))

    straight = run(tmp_path / "straight", 1)
    run(tmp_path / "resumed", 0)
    # continuing for more steps is a change of settings: refused unless said, then recorded
    with pytest.raises(ConfigError, match=r"(?m)^  rl.dense_steps: 0 -> 1$"):
        run(tmp_path / "resumed", 1)
    resumed = run(tmp_path / "resumed", 1, "allow_config_change=true")
    [change] = [json.loads(line) for line in (tmp_path / "resumed" / "config_changes.jsonl").open()]
    assert {"key": "rl.dense_steps", "saved": 0, "new": 1} in change["changes"]
    a = dict(straight["model"].named_parameters())
    b = dict(resumed["model"].named_parameters())
    changed = 0
    for name, p in a.items():
        assert torch.equal(p, b[name]), name
        changed += p.requires_grad
    assert changed > 0
    metrics = lambda d: [  # noqa: E731
        json.loads(line) for line in (d / "metrics.jsonl").open() if '"reward"' in line
    ]
    assert (
        metrics(tmp_path / "straight")[-1]["loss_mu"]
        == metrics(tmp_path / "resumed")[-1]["loss_mu"]
    )
    # the questions are a function of the step: the resumed run drew what the straight one did
    batches = lambda d: (d / "batches.jsonl").read_text()  # noqa: E731
    assert batches(tmp_path / "resumed") == batches(tmp_path / "straight")
    assert [json.loads(x)["step"] for x in batches(tmp_path / "straight").splitlines()] == [1, 2]


def test_missing_assets_stop_before_any_model_loads(tmp_path, capsys):
    code = main(
        [
            "train",
            "--config",
            str(CONFIG),
            f"assets.model={tmp_path / 'nope'}",
            f"warmup_dir={tmp_path / 'w'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "assets.model" in err and "make warmup" in err
    assert "warmup_dir" in err and "arco warmup" in err
    assert not (tmp_path / "w").exists()


def test_bad_settings_are_one_line_errors(capsys):
    for bad, key in (
        ("rubric.prefix=later", "rubric.prefix"),
        ("rl.kl_direction=up", "kl_direction"),
        ("warmup.pi_epochs=-1", "warmup.pi_epochs"),
    ):
        assert main(["train", "--config", str(CONFIG), bad]) == 2
        assert key in capsys.readouterr().err
    assert main(["train", "--config", str(CONFIG), "train.zero_stage=3"]) == 2
    assert "ZeRO-2" in capsys.readouterr().err
