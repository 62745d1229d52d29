"""ARCO end to end on the tiny world: warmup (oracle teacher) -> co-evolution RL -> eval, with the
real vLLM engine serving both adapters; resume after an interruption; errors before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arco.cli import main
from arco.config import ArcoConfig
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
