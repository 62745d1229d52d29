"""The DeepSpeed launcher's ``--local_rank`` is dropped by every command before it parses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.launcher import without_local_rank

ROOT = Path(__file__).resolve().parents[1]


def test_local_rank_is_dropped_in_both_spellings_and_sets_the_environment(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    got = without_local_rank(["--local_rank=1", "train", "--config", "a.yaml", "steps=2"])
    assert got == ["train", "--config", "a.yaml", "steps=2"]
    assert os.environ["LOCAL_RANK"] == "1"
    monkeypatch.setenv("LOCAL_RANK", "0")  # the launcher's environment wins
    assert without_local_rank(["train", "--local_rank", "3", "x=1"]) == ["train", "x=1"]
    assert os.environ["LOCAL_RANK"] == "0"
    assert without_local_rank(["train", "local_rank=2"]) == ["train", "local_rank=2"]


@pytest.mark.slow
def test_a_package_command_under_the_deepspeed_launcher_reaches_its_own_error(tmp_path):
    """``deepspeed --module eviback train ...`` used to die on ``unrecognized arguments:
    --local_rank=0`` before reading its config."""
    missing = tmp_path / "missing.yaml"
    command = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1",
               "--module", "eviback", "train", "--config", str(missing)]  # fmt: skip
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    output = run.stdout + run.stderr
    assert "unrecognized arguments" not in output, output[-3000:]
    assert "eviback train: error:" in output and "missing.yaml" in output, output[-3000:]
