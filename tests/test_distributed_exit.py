"""``exit_process``: a rank's exit keeps Python's exit work and its code; one process exits as
``sys.exit`` does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "exit_ranks.py"


def test_single_process_exits_as_sys_exit_does():
    code = (
        "import atexit\n"
        "from common.train.distributed import exit_process\n"
        "atexit.register(print, 'handler ran')\n"
        "exit_process(3)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "handler ran\n"


def test_ranks_run_their_exit_work_and_keep_their_codes(tmp_path, launch_two_ranks):
    run = launch_two_ranks([str(SCRIPT), "--out", str(tmp_path)], torchrun=True)
    output = run.stdout + run.stderr
    # rank 1 exits with 1: the launcher reports the failure of that rank
    assert run.returncode != 0, output
    for rank in (0, 1):
        assert f"rank {rank}: unflushed" in run.stdout
        assert (tmp_path / f"thread-{rank}").read_text() == "done"
        assert (tmp_path / f"late-{rank}").read_text() == "group up: True"
        assert (tmp_path / f"early-{rank}").read_text() == "group up: False"
    assert output.count("exitcode  :") == 1 and "exitcode  : 1" in output, output
    assert "terminate called" not in output
