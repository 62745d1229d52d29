"""A full disk, a read-only run folder and a run folder under a file end a command in one line
naming the path and what to do, exit code 2 (each was a traceback). The disks are real:
/dev/full (its writes fail with ENOSPC) and tmpfs mounts where mounting is allowed (as root,
chmod does not stop a write; a read-only mount does)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from common.launcher import ERROR_EXIT_CODE, run_command, write_failure
from common.train.checkpoint import CheckpointSaveError

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "common" / "configs" / "grpo_tiny.yaml"
ELSEWHERE = "or point run_dir (or the command's output folder) at another"


@pytest.fixture
def tmpfs(tmp_path):
    """``mount(options)``: a tmpfs mounted with ``options`` at a new folder (root with mount
    rights only; else skip)."""
    mounted = []

    def mount(options: str) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        cmd = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        if subprocess.run(["umount", str(point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], check=True)


def exit_of(main) -> int:
    with pytest.raises(SystemExit) as exited:
        run_command(main)
    return exited.value.code


def grpo(world: Path, run_dir: Path) -> int:
    """``python -m common.search_grpo`` (its ``main`` under ``run_command``) on the tiny world."""
    from common.search_grpo import main

    over = [f"assets.world={world}", f"assets.model={world / 'model'}", f"run_dir={run_dir}"]
    over += ["steps=1", "questions_per_step=1", "n=2", "loss.micro_batch_size=2"]
    over += ["eval_every=0", "engine.backend=hf", "agent.max_turns=1", "agent.max_turn_tokens=8"]
    return exit_of(lambda: main(["--config", str(CONFIG), *over]))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this system")
def test_a_write_to_a_full_disk_names_the_file_and_what_to_do(tmp_path, capsys):
    """A real ENOSPC (/dev/full's): the failed write names no file, so the line takes the file
    open in the traceback."""
    log = tmp_path / "metrics.jsonl"
    log.symlink_to("/dev/full")

    def main() -> int:
        with log.open("a") as f:
            f.write('{"step": 1}\n')
            f.flush()
        return 0

    assert exit_of(main) == ERROR_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert re.fullmatch(
        re.escape(f"error: cannot write {log}: no space left on its disk (")
        + r"\d+\.\d\d GiB free there\); "
        + re.escape(f"free space there, {ELSEWHERE} disk; a training run resumes from its ")
        + "latest checkpoint\n",
        err,
    )


def test_an_error_that_wrote_its_own_line_is_that_line_and_others_still_raise(capsys):
    saved = CheckpointSaveError("checkpoint of step 3 not saved: no space left on device (...)")
    saved.errno = errno.ENOSPC  # as common.train.checkpoint raises it

    def fail(err: Exception):
        def main() -> int:
            raise err

        return main

    assert exit_of(fail(saved)) == 2
    assert capsys.readouterr().err == f"error: {saved}\n"
    assert write_failure(OSError(errno.EIO, "Input/output error")) is None
    with pytest.raises(ConnectionResetError):  # not the disk: the traceback stays
        run_command(fail(ConnectionResetError(errno.ECONNRESET, "reset")))


def test_a_run_dir_under_a_file_is_one_line(tiny_world, tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    run_dir = tmp_path / "afile" / "run"
    assert grpo(tiny_world, run_dir) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: cannot write {run_dir}: a part of its path is a file, not a folder; remove or "
        f"rename that file, {ELSEWHERE} folder"
    )


def test_a_read_only_run_folder_is_one_line(tiny_world, tmpfs, capsys):
    disk = tmpfs("ro,size=64k")
    assert grpo(tiny_world, disk / "run") == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: cannot write {disk / 'run'}: the file system is read-only; remount it "
        f"writable, {ELSEWHERE} folder"
    )


def test_a_disk_too_small_for_the_checkpoints_is_one_line(tiny_world, tmpfs, capsys):
    """Found before anything but the lock is written (``check_checkpoint_space``); before, a
    ``CheckpointSpaceError`` traceback through ``python -m common.search_grpo`` and ``cer``."""
    disk = tmpfs("size=64k")
    assert grpo(tiny_world, disk / "run") == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("error: not enough disk space for the run's checkpoints: 1 checkpoint")
    assert line.endswith(
        f"under {disk / 'run' / 'checkpoints'}, 0.00 GiB free; free space, lower "
        "keep_checkpoints or choose a run_dir on a larger disk"
    )
    assert sorted(p.name for p in (disk / "run").iterdir()) == ["run.lock"]
