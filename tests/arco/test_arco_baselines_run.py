"""The PRM and outcome-only baselines end to end in ARCO's trainer on the tiny world (HF engine):
the PRM's warmup trains a one-score head without criteria, its RL leaves μ untouched; the
outcome-only run is all sparse steps with no μ at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_arco_run import CONFIG, ROOT, overrides

from arco.config import ArcoConfig
from arco.rubric_model import HEAD_FILE
from common.config import load_config


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").open() if '"reward"' in line]


def _adapter(folder: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapters" / name / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def prm_warmed(tiny_world, tmp_path_factory) -> Path:
    """One PRM warmup (rubric mode none, one score a step) for both baselines: outcome-only
    never reads μ, so any warmup serves it. No π SFT (``warmup.pi_epochs=0``, the tiny
    config's own setting)."""
    from arco.warmup import run_warmup

    out = tmp_path_factory.mktemp("prm")
    over = overrides(tiny_world, out, "hf") + ["method=prm", "warmup.pi_epochs=0"]
    run_warmup(load_config(ArcoConfig, CONFIG, over))
    return out


@pytest.mark.slow
def test_prm_warmup_and_frozen_rl(tiny_world, prm_warmed):
    from arco.trainer import train_arco

    over = overrides(tiny_world, prm_warmed, backend="hf") + ["method=prm"]
    warm = prm_warmed / "warmup"
    meta = json.loads((warm / "arco.json").read_text())
    assert meta["k"] == 1 and meta["rubric"]["mode"] == "none"
    assert load_file(str(warm / HEAD_FILE))["net.4.weight"].shape[0] == 1
    report = json.loads((warm / "report.json").read_text())
    assert all(e["criteria_ce"] == 0.0 for e in report["mu_sft"]["epochs"])  # nothing to write
    # pi_epochs = 0: π's adapter is still the identity (LoRA B = 0), π is the backbone
    assert report["pi_sft"]["skipped"] == "warmup.pi_epochs = 0"
    policy, ref = _adapter(warm, "policy"), _adapter(warm, "policy_ref")
    lora_b = [k for k in policy if "lora_B" in k]
    assert lora_b and all(not policy[k].any() for k in lora_b)
    assert all(torch.equal(t, ref[k]) for k, t in policy.items())
    out = train_arco(load_config(ArcoConfig, CONFIG, over))
    ckpt = Path(out["run_dir"]) / "checkpoints" / "step_2"
    for name in ("rubric",):  # μ is the warmup's, bit for bit
        for key, t in _adapter(warm, name).items():
            assert torch.equal(t, _adapter(ckpt, name)[key]), key
    for key, t in load_file(str(warm / HEAD_FILE)).items():
        assert torch.equal(t, load_file(str(ckpt / HEAD_FILE))[key]), key
    assert any(
        not torch.equal(t, _adapter(ckpt, "policy")[k]) for k, t in _adapter(warm, "policy").items()
    )
    rows = _rows(Path(out["run_dir"]))
    assert [r["phase_dense"] for r in rows] == [0.0, 1.0]
    assert all("decomposition_error" in r and "criteria_valid_rate" not in r for r in rows)
    assert all("mu_decomp_loss" not in r for r in rows)
    sample = json.loads((Path(out["run_dir"]) / "samples" / "step_00002.json").read_text())
    assert all(len(s["scores"]) == 1 and s["criteria"] == [] for s in sample[0]["steps"])
    # an ARCO run cannot start from the PRM's warmup
    with pytest.raises(ValueError, match="gives 1 scores a step"):
        train_arco(load_config(ArcoConfig, CONFIG, over[:-1] + [f"run_dir={prm_warmed / 'x'}"]))


@pytest.mark.slow
def test_outcome_only_is_all_grpo_steps_without_mu(tiny_world, prm_warmed, tmp_path):
    from arco.trainer import train_arco

    over = overrides(tiny_world, prm_warmed, backend="hf")
    over += [f"run_dir={tmp_path / 'run'}", "method=outcome_only"]
    out = train_arco(load_config(ArcoConfig, CONFIG, over))
    rows = _rows(Path(out["run_dir"]))
    assert [r["phase_dense"] for r in rows] == [0.0, 0.0]  # 1 sparse + 1 dense -> 2 sparse
    # ARCO's schedule: after its sparse phase π takes the dense lr and pays KL(π‖π_ref) (here
    # ~0: one GRPO step on 2 x 2 rollouts rarely moves π)
    assert [r["pi_late_schedule"] for r in rows] == [0.0, 1.0]
    assert rows[0]["pi_kl"] == 0.0 and rows[1]["pi_kl"] >= 0.0
    assert all("decomposition_error" not in r and "time/rubric_generation" not in r for r in rows)
    ckpt = Path(out["run_dir"]) / "checkpoints" / "step_2"
    for key, t in _adapter(prm_warmed / "warmup", "rubric").items():
        assert torch.equal(t, _adapter(ckpt, "rubric")[key]), key


def quarter(completions, **kwargs):
    """A TRL-style reward function: 0.25 for every completion."""
    return [0.25] * len(completions)


@pytest.mark.slow
def test_arco_s_outcome_reward_is_reward_fn(tiny_world, prm_warmed, tmp_path):
    """``reward.fn`` is R(τ): here a TRL function, given directly; the steps log its reward, its
    metrics and what TRL and verl users look for."""
    from arco.trainer import train_arco

    over = overrides(tiny_world, prm_warmed, backend="hf")
    over += [f"run_dir={tmp_path / 'run'}", "method=outcome_only", f"reward.fn={__name__}:quarter"]
    over += ["rl.dense_steps=0"]  # one step
    out = train_arco(load_config(ArcoConfig, CONFIG, over))
    rows = _rows(Path(out["run_dir"]))
    assert [r["reward"] for r in rows] == [0.25]
    assert all(r["trl/quarter/none_share"] == 0.0 for r in rows)
    for r in rows:
        assert r["lr"] == r["lr/policy"] > 0 and r["clip_frac"] == 0.0
        assert 0 < r["response_length/mean"] <= r["response_length/max"]
    sample = json.loads((Path(out["run_dir"]) / "samples" / "step_00001.json").read_text())
    assert all(s["reward"] == 0.25 for s in sample)


@pytest.mark.slow
def test_a_variant_warmup_takes_pi_from_another_and_trains_its_own_mu(tiny_world, prm_warmed):
    """w/o Adaptive's warmup on the PRM warmup's π: π bit for bit, μ for fixed criteria."""
    from arco.warmup import run_warmup

    src = prm_warmed / "warmup"
    over = overrides(tiny_world, prm_warmed, backend="hf") + [
        f"warmup_dir={prm_warmed / 'fixed'}",
        "rubric.mode=fixed",
        f"rubric.criteria_file={ROOT / 'arco' / 'criteria' / 'tiny.txt'}",
        f"warmup.policy_from={src}",
    ]
    out = run_warmup(load_config(ArcoConfig, CONFIG, over))
    for key, t in _adapter(src, "policy").items():
        assert torch.equal(t, _adapter(out, "policy")[key]), key
    meta = json.loads((out / "arco.json").read_text())
    assert meta["k"] == 3 and meta["rubric"]["mode"] == "fixed"
    report = json.loads((out / "report.json").read_text())
    assert report["pi_sft"] == {"policy_from": str(src)}


def test_policy_from_without_a_warmup_is_a_missing_asset(tiny_world, tmp_path):
    over = overrides(tiny_world, tmp_path) + [f"warmup.policy_from={tmp_path / 'none'}"]
    with pytest.raises(FileNotFoundError, match="warmup.policy_from: .* has no arco.json"):
        load_config(ArcoConfig, CONFIG, over).check_assets(("teacher",))


@pytest.mark.slow
def test_an_external_step_scorer_drives_the_dense_phase_in_mu_s_place(
    tiny_world, prm_warmed, tmp_path
):
    """reward.step_scorer=experiments.step_scorers:TeacherEvidenceSteps: the sparse step is ARCO's
    GRPO step, the dense step's advantages come from the teacher's step scores, μ is untouched."""
    from arco.trainer import train_arco

    over = overrides(tiny_world, prm_warmed, backend="hf") + [
        f"run_dir={tmp_path / 'run'}",
        "reward.step_scorer=experiments.step_scorers:TeacherEvidenceSteps",
    ]
    cfg = load_config(ArcoConfig, CONFIG, over)
    assert cfg.mu_frozen and not cfg.uses_mu  # μ is not used in RL
    out = train_arco(cfg)
    rows = _rows(Path(out["run_dir"]))
    assert [r["phase_dense"] for r in rows] == [0.0, 1.0]
    assert "time/step_scorer" in rows[1] and "time/step_scorer" not in rows[0]
    assert all("decomposition_error" not in r and "time/rubric_generation" not in r for r in rows)
    ckpt = Path(out["run_dir"]) / "checkpoints" / "step_2"
    for key, t in _adapter(prm_warmed / "warmup", "rubric").items():
        assert torch.equal(t, _adapter(ckpt, "rubric")[key]), key
    sample = json.loads((Path(out["run_dir"]) / "samples" / "step_00002.json").read_text())
    # the untrained tiny model's steps are invalid: s_t = 0, so every A_t = c·(0 − 0) = 0
    for traj in sample:
        assert all("step_score" in st and "criteria" not in st for st in traj["steps"])
        assert traj["sum_step_scores"] == sum(st["step_score"] for st in traj["steps"])
        for st in traj["steps"]:
            if st["kind"] == "invalid":
                assert st["step_score"] == 0.0
    if all(st["kind"] == "invalid" for t in sample for st in t["steps"]):
        assert all(st["advantage"] == 0.0 for t in sample for st in t["steps"])
