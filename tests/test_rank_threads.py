"""Torch threads per rank: each rank a launcher starts on a host takes its share of the CPUs
(``common.train.distributed.set_rank_threads``), and vLLM, sharing the process, keeps them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.train.distributed import set_rank_threads, threads_per_rank

SCRIPT = Path(__file__).parent / "scripts" / "rank_threads.py"


@pytest.fixture
def torch_threads():
    """torch's thread count, restored after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_per_rank_is_the_host_share():
    assert threads_per_rank(16, {}) == 16
    assert threads_per_rank(16, {"LOCAL_WORLD_SIZE": "8"}) == 2
    assert threads_per_rank(16, {"LOCAL_SIZE": "3"}) == 5
    assert threads_per_rank(2, {"LOCAL_WORLD_SIZE": "8"}) == 1


def test_a_rank_takes_its_share_of_its_cpus_and_never_more_than_it_has(monkeypatch, torch_threads):
    """share = CPUs this process may run on // ranks on the host, at least 1; a count already
    below the share stands; OMP_NUM_THREADS says the result."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpus = len(os.sched_getaffinity(0))
    torch.set_num_threads(cpus)
    assert set_rank_threads({"LOCAL_SIZE": "2"}) == max(1, cpus // 2) == torch.get_num_threads()
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, cpus // 2))
    torch.set_num_threads(1)
    assert set_rank_threads({"LOCAL_SIZE": "1"}) == 1 == torch.get_num_threads()
    torch.set_num_threads(cpus)
    assert set_rank_threads({}) == cpus == torch.get_num_threads()  # one rank: all it has


def test_vllm_keeps_the_trainers_threads(monkeypatch, torch_threads):
    """vLLM's GPU worker drops torch to one thread "for serving" unless OMP_NUM_THREADS is set and
    not its own (it leaves OMP_NUM_THREADS and VLLM_OMP_NUM_THREADS_SET_BY_VLLM=1 behind when it
    picks a count for its workers); the engine's ``keep_torch_threads`` makes it keep them."""
    pytest.importorskip("vllm")
    from vllm.utils.torch_utils import set_torch_threads_for_runtime

    from common.rollout.vllm_engine import keep_torch_threads

    if torch.set_num_threads.__module__.startswith("vllm"):
        pytest.skip("a CPU vLLM engine in this process made torch.set_num_threads a no-op")
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("VLLM_OMP_NUM_THREADS_SET_BY_VLLM", "1")
    monkeypatch.delenv("LOCAL_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    keep_torch_threads()
    set_torch_threads_for_runtime()  # what vLLM's worker calls once its weights are loaded
    assert torch.get_num_threads() == min(2, len(os.sched_getaffinity(0)))
    assert os.environ["OMP_NUM_THREADS"] == str(torch.get_num_threads())


@pytest.mark.slow
def test_two_launched_ranks_each_take_half_the_cpus(tmp_path, monkeypatch, launch_two_ranks):
    """Under the DeepSpeed launcher (which sets no OMP_NUM_THREADS) each of two CPU ranks runs on
    its share of the CPUs, not on every one of them."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fresh = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    expected = min(int(fresh.stdout), max(1, len(os.sched_getaffinity(0)) // 2))
    run = launch_two_ranks([str(SCRIPT), "--out", str(tmp_path)], one_thread=False, timeout=300)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    reports = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert reports == [f"threads {expected} omp {expected}"] * 2
