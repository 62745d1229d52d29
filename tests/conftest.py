"""Session-wide fixtures: the tiny world is built once per test session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings
from xdist_pinning import pin_xdist_worker

ROOT = Path(__file__).resolve().parent.parent

# property tests assert values, not speed (speed is measured in benchmarks/): no per-example
# deadline, which a busy 2-core machine misses now and then (a flaky failure, not a finding)
settings.register_profile("project", deadline=None)
settings.load_profile("project")

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The longest files, started first: under pytest-xdist (`--dist loadfile`) a file runs whole on one
# worker, so a long one left for the end keeps the other worker idle. Serially the order is moot.
LONG_FILES = (
    "tests/rehearse/test_rehearse_configs.py",
    "tests/arco/test_arco_run.py",
    "tests/arco/test_arco_two_ranks.py",
    "tests/test_train_engine.py",
    "tests/test_evaluate_all.py",
    "tests/eviback/test_eviback_train_run.py",
    "tests/test_smol.py",
)


pin_xdist_worker()  # before anything imports torch


def pytest_collection_modifyitems(config, items):
    import torch

    first = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: first.get(item.nodeid.split("::")[0], len(first)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """The default-size tiny world (seed 0): corpus, questions, tokenizer and random model."""
    from common.tinyworld import build_world

    return build_world(tmp_path_factory.mktemp("tinyworld") / "world", seed=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function that returns a loopback port free at the time of the call."""
    return _free_port


@pytest.fixture(scope="session")
def launch_two_ranks() -> Callable[..., subprocess.CompletedProcess]:
    """A function that runs ``args`` (a script and its arguments, or ``-m module ...``) as two CPU
    ranks, the CPU stand-in for two GPUs: under the DeepSpeed launcher, or ``torchrun``; from the
    project root, output captured. ``one_thread``: OMP_NUM_THREADS=1 in each rank."""

    def launch(
        args: list[str], *, torchrun: bool = False, one_thread: bool = True, timeout: int = 600
    ) -> subprocess.CompletedProcess:
        port = str(_free_port())
        if torchrun:
            launcher = ["torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
        else:
            launcher = ["deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", port]
        env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
        if one_thread:
            env["OMP_NUM_THREADS"] = "1"
        command = [sys.executable, "-m", *launcher, *args]
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
        )

    return launch


@pytest.fixture(scope="session")
def qwen3_tokenizer(request, tmp_path_factory):
    """Qwen3's real tokenizer (tests/qwen_tokenizer.py), its tokenizer.json cached under the
    pytest cache (a temp dir when the cache is off)."""
    from qwen_tokenizer import build_qwen3_tokenizer

    cache = getattr(request.config, "cache", None)
    cache_dir = cache.mkdir("qwen3_tokenizer") if cache else tmp_path_factory.mktemp("qwen3_tok")
    return build_qwen3_tokenizer(cache_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(qwen3_tokenizer, tmp_path_factory) -> Path:
    """A random tiny Qwen3 with Qwen3's vocabulary, saved with its tokenizer (transformers and
    vLLM load the folder)."""
    from qwen_tokenizer import build_tiny_qwen3

    return build_tiny_qwen3(qwen3_tokenizer, tmp_path_factory.mktemp("tiny_qwen3") / "model")
