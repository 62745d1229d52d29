"""``make gpu-check``'s verdicts from a run's training rows, and its refusal on a CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from experiments.gpu_check import GAP_LIMIT, step_checks

ROOT = Path(__file__).resolve().parents[1]


def row(**values) -> dict:
    return {"loss": 0.1, "train_mode": 1.0, "logprob_gap": 0.01, "identical_group_share": 0.0,
            "memory/update_peak_gib": 10.0, "memory/update_device_gib": 30.0} | values  # fmt: skip


def verdicts(rows, capacity=80.0) -> dict[str, bool]:
    return {c.name: c.ok for c in step_checks(rows, capacity)}


def test_a_healthy_run_passes_every_check():
    assert verdicts([row(), row()]) == {
        "training steps": True,
        "model.training": True,
        "train-vs-engine log-prob gap": True,
        "identical-rollout share": True,
        "memory by phase": True,
    }


def test_each_gpu_failure_fails_its_own_check():
    assert not verdicts([row(), row(train_mode=0.0)])["model.training"]
    assert not verdicts([row(logprob_gap=2 * GAP_LIMIT)])["train-vs-engine log-prob gap"]
    # an all-zero step measures no gap (NaN): it neither fails the check nor dilutes a real one
    nan = float("nan")
    assert verdicts([row(logprob_gap=nan), row()])["train-vs-engine log-prob gap"]
    gap = [row(logprob_gap=nan)] * 5 + [row(logprob_gap=2 * GAP_LIMIT)]
    assert not verdicts(gap)["train-vs-engine log-prob gap"]
    assert not verdicts([row(logprob_gap=nan)])["train-vs-engine log-prob gap"]
    assert not verdicts([row(identical_group_share=1.0)])["identical-rollout share"]
    # a stand-in's few groups tie by chance now and then; one seed a group ties them all
    assert verdicts([row(identical_group_share=0.5), row()])["identical-rollout share"]
    assert not verdicts([row(**{"memory/update_device_gib": 90.0})])["memory by phase"]
    cpu = {k: v for k, v in row().items() if not k.startswith("memory/")}
    assert not verdicts([cpu])["memory by phase"]
    missing = {"loss": 0.1}
    assert verdicts([missing]) == {
        "training steps": True,
        "model.training": False,
        "train-vs-engine log-prob gap": False,
        "identical-rollout share": False,
        "memory by phase": False,
    }
    assert verdicts([]) == {"training steps": False}


def test_memory_detail_names_each_phase():
    (check,) = [c for c in step_checks([row(**{"memory/rollout_peak_gib": 2.0})], 80.0)
                if c.name == "memory by phase"]  # fmt: skip
    assert "rollout peak 2.00 GiB" in check.detail and "update peak 10.00 GiB" in check.detail


def test_gpu_check_refuses_a_machine_without_cuda_in_one_line():
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "experiments.gpu_check"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "[gpu-check] no CUDA device here (torch.cuda.is_available() is False): run it on a GPU "
        "machine; on a CPU the paper configs are rehearsed by `make rehearse`"
    ]
