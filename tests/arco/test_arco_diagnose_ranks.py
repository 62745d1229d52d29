"""`arco diagnose` is one process: as one of a launcher's ranks it refuses in one line before it
loads anything (every rank would take the same GPU and write the same report)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_diagnose_under_two_ranks_refuses_with_one_line(tmp_path):
    env = os.environ | {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    command = [sys.executable, "-m", "arco", "--local_rank=1", "diagnose", "--config",
               "arco/configs/tiny.yaml", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "arco diagnose: error: runs in one process, not under a launcher's ranks (WORLD_SIZE=2): "
        "start it with `python -m arco diagnose ...`, without the DeepSpeed launcher or torchrun "
        "(its rollouts and μ's scoring are not split over ranks)"
    ]
    assert not (tmp_path / "run").exists()
