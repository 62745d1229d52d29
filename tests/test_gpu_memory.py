"""Memory by phase (common/train/gpu_memory.py) from hand-made readings: a sleeping vLLM's pool,
still counted by torch's allocator, is not in the update's peak."""

from __future__ import annotations

import pytest

from common.train import gpu_memory
from common.train.gpu_memory import GIB, phase_readings
from experiments.gpu_check import step_checks


def test_a_sleeping_pool_does_not_count_in_the_update_peak():
    # an 80 GiB GPU; vLLM's pool (weights + KV cache) 30 GiB, asleep through the update; the
    # allocator's peak counts its tensors: 30 GiB of pool + 46 GiB the update allocated
    update = phase_readings("update", 76 * GIB, free=30 * GIB, total=80 * GIB, asleep_pool=30 * GIB)
    assert update == {"memory/update_peak_gib": 46.0, "memory/update_device_gib": 50.0}
    # awake (rollout, push), the pool is on the device and counts
    rollout = phase_readings("rollout", 40 * GIB, free=10 * GIB, total=80 * GIB)
    assert rollout == {"memory/rollout_peak_gib": 40.0, "memory/rollout_device_gib": 70.0}
    # a reading inside the phase (before the sleep) above the one at its end is the device's
    slept = phase_readings("rollout", 40 * GIB, 40 * GIB, 80 * GIB, seen_used=72 * GIB)
    assert slept["memory/rollout_device_gib"] == 72.0
    # never below 0 (a pool measured a page larger than the allocator's count)
    assert (
        phase_readings("update", GIB, 0, 80 * GIB, asleep_pool=2 * GIB)["memory/update_peak_gib"]
        == 0.0
    )


def test_gpu_check_passes_a_run_that_fits_beside_a_sleeping_pool():
    """An 80 GiB GPU, a 30 GiB pool asleep through the update, 52 GiB of training in it (the
    device then holds 56): it fits. The allocator's peak with the pool (82 GiB) failed it."""
    row = {"loss": 0.1, "train_mode": 1.0, "logprob_gap": 0.01, "identical_group_share": 0.0}
    row |= phase_readings("rollout", 40 * GIB, 10 * GIB, 80 * GIB)
    update = {"allocated_peak": 82 * GIB, "free": 24 * GIB, "total": 80 * GIB}
    now = row | phase_readings("update", **update, asleep_pool=30 * GIB)
    before = row | phase_readings("update", **update)  # the pool counted
    assert (now["memory/update_peak_gib"], before["memory/update_peak_gib"]) == (52.0, 82.0)

    def memory_ok(r: dict) -> bool:
        (check,) = [c for c in step_checks([r], 80.0) if c.name == "memory by phase"]
        return check.ok

    assert memory_ok(now) and not memory_ok(before)


def test_phase_memory_is_empty_without_cuda_and_forgets_the_phases_readings():
    gpu_memory.note_device_use(5 * GIB)
    assert gpu_memory._seen_in_phase[0] == 5 * GIB
    if gpu_memory.device_memory() is not None:
        pytest.skip("a CUDA device: phase_memory reads it")
    assert gpu_memory.phase_memory("update", asleep_pool=GIB) == {}
    assert gpu_memory._seen_in_phase[0] == 0  # the next phase starts afresh
