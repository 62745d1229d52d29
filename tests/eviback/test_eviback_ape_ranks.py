"""`eviback ape` is one process: started as one of a launcher's several ranks it refuses with one
line before it loads a model or writes anything (every rank would take the same GPU and run the
whole pipeline)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ape_under_two_ranks_refuses_with_one_line_before_any_work(tmp_path):
    out = tmp_path / "ape"
    env = os.environ | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    # as the DeepSpeed launcher starts a rank; with a teacher, so nothing else stops it first
    command = [
        sys.executable,
        "-m",
        "eviback",
        "--local_rank=0",
        "ape",
        "assets.teacher_endpoint=http://127.0.0.1:9/v1",
        "assets.teacher_model=t",
        f"ape.out={out}",
        f"assets.model={tmp_path / 'no-model'}",
    ]
    start = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [
        "eviback ape: error: runs in one process, not under a launcher's ranks (WORLD_SIZE=2): "
        "start it with `python -m eviback ape ...`, without the DeepSpeed launcher or torchrun "
        "(E2E-APE's rollouts, controller and teacher calls are not split over ranks)"
    ]
    assert run.stdout == ""
    assert not out.exists()  # refused before the output folder, the rollouts or the teacher
    assert time.monotonic() - start < 60
