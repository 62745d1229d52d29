"""``exit_process``: a rank's exit keeps Python's exit work and its code; one process exits as
``sys.exit`` does. ``init_distributed`` leaves no DeepSpeed shm buffer behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "exit_ranks.py"
ROOT = Path(__file__).resolve().parent.parent


def assert_exit_work_done(out: Path, ranks: range) -> None:
    for rank in ranks:
        assert (out / f"thread-{rank}").read_text() == "done"
        assert (out / f"late-{rank}").read_text() == "group up: True"
        assert (out / f"early-{rank}").read_text() == "group up: False"


# a global's finalizer runs at interpreter finalization, which a rank's exit skips
FINALIZED = (
    "import atexit\n"
    "class Finalized:\n"
    "    def __del__(self):\n"
    "        print('finalized', flush=True)\n"
    "kept = Finalized()\n"
    "atexit.register(print, 'handler ran')\n"
)


def test_single_process_exits_as_sys_exit_does():
    code = FINALIZED + "from common.train.distributed import exit_process\nexit_process(3)\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "handler ran\nfinalized\n"


def test_a_rank_whose_group_another_library_made_skips_finalization(free_port):
    """A launcher's rank is one by its environment, whoever made its group (TRL's is
    accelerate's, not init_distributed's): it runs its handlers and leaves before
    finalization."""
    env = os.environ | {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(free_port())}  # fmt: skip
    code = FINALIZED + (
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "from common.train.distributed import exit_process\n"
        "exit_process(4)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 4, run.stderr
    assert run.stdout == "handler ran\n"


def test_a_rank_exits_with_its_code_after_its_exit_work(tmp_path, free_port):
    env = os.environ | {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                        "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    command = [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--code", "3"]
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.endswith("rank 0: unflushed")
    assert_exit_work_done(tmp_path, range(1))


def test_two_ranks_exit_cleanly_and_leave_no_shm_buffer(tmp_path, launch_two_ranks):
    """Under the DeepSpeed launcher (which sets LOCAL_SIZE) DeepSpeed's CPU shm allreduce maps a
    segment a rank and never unlinks it; init_distributed does, once both ranks mapped both."""
    run = launch_two_ranks([str(SCRIPT), "--out", str(tmp_path)])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "terminate called" not in run.stderr
    for rank in (0, 1):
        assert f"rank {rank}: unflushed" in run.stdout
        mapped = (tmp_path / f"shm-{rank}").read_text().splitlines()
        assert len(mapped) == 2 and all(m.endswith(" (deleted)") for m in mapped), mapped
        assert sorted(m.split()[0][-2:] for m in mapped) == ["_0", "_1"], mapped
    assert_exit_work_done(tmp_path, range(2))
