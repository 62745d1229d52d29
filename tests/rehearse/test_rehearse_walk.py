"""The rehearsal walks the README's "One paper run": its make targets in the README's order, the
services in the background stopped whatever happens, the stand-ins passed by make variables."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.rehearse import runner
from experiments.rehearse.stages import Stage, command_line, config_overrides
from experiments.rehearse.walk import (
    SKIPPED,
    background,
    group_alive,
    make_argv,
    make_vars,
    readme_sequences,
    runs_through_make,
    walked,
    without_make_env,
)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()

BLOCKS = """# x

## One paper run

```
make rehearse METHOD=eviback SCALE=1.7b   # on a CPU
CUDA_VISIBLE_DEVICES=6 make serve-retrieval INDEX=data/search_r1 &  # one GPU
make wait-services METHOD=eviback SCALE=1.7b
```

Text with `make train-cer` outside a block is not a step.

```
make data METHOD=arco SCALE=qwen3-4b
make train-arco GPUS=8 && make eval-arco GPUS=8  # make warmup-arco in a comment is not
```

## Next

```
make data METHOD=cer
```
"""


def test_readme_sequences_reads_each_block_of_the_section_in_order():
    assert readme_sequences(BLOCKS) == {
        "eviback": ["rehearse", "serve-retrieval", "wait-services"],
        "arco": ["data", "train-arco", "eval-arco"],
    }


def test_the_readme_names_each_method_and_the_steps_a_cpu_cannot_run():
    seqs = readme_sequences(README)
    assert set(seqs) == {"eviback", "arco", "cer"}
    assert walked(seqs["eviback"]) == [
        "data", "data-index", "serve-retrieval", "wait-services", "ape-eviback",
        "train-eviback", "eval-eviback",
    ]  # fmt: skip
    assert set(seqs["eviback"]) - set(walked(seqs["eviback"])) == set(SKIPPED)
    assert walked(seqs["arco"]) == ["data", "warmup-arco", "train-arco", "eval-arco"]
    assert walked(seqs["cer"]) == ["data", "train-cer", "eval-cer"]


def _setup(config: str, tmp_path: Path) -> runner.Setup:
    raw = runner.loaded_config(Path(config), None)
    return runner.Setup(
        Path(config), raw, None, 1, tmp_path, "cpu", tmp_path / "model", {},
        "http://127.0.0.1:1/retrieve", "http://127.0.0.1:2/v1", dict, [], make_vars(config),
    )  # fmt: skip


@pytest.mark.parametrize(
    "config",
    [
        "eviback/configs/qwen3_1.7b.yaml",
        "arco/configs/qwen3_4b_hotpotqa.yaml",
        "cer/configs/qwen3_4b_base_math.yaml",
    ],
)
def test_the_rehearsals_steps_are_the_readmes_in_its_order(config, tmp_path):
    setup = _setup(config, tmp_path)
    expected = walked(readme_sequences(README)[setup.make_vars["METHOD"]])
    assert runner.readme_walk(setup) == expected


def test_eviback_trains_after_ape_with_its_policy_and_waits_for_the_services_first(tmp_path):
    stages = runner.eviback_plan(_setup("eviback/configs/qwen3_0.6b.yaml", tmp_path))
    names = [s.name for s in stages]
    assert names[:3] == ["wait-services", "ape", "train"]
    wait, ape, train = stages[:3]
    assert wait.make == "wait-services" and ape.make == "ape-eviback"
    # through make (ARGS= there): the README's command with the stand-ins' variables
    argv = command_line(wait)
    assert argv[:3] == ["make", "--no-print-directory", "wait-services"]
    assert {"METHOD=eviback", "SCALE=0.6b", f"WAIT_S={runner.WAIT_S}"} <= set(argv)
    assert any(a.startswith("ARGS=") and "assets.retrieval_url=" in a for a in argv)
    policy = str(tmp_path / "runs" / "eviback" / "ape" / "policy.yaml")
    if train.make_vars is not None:  # train-eviback takes ARGS=: APE_POLICY= passes the policy
        assert train.make_vars["APE_POLICY"] == policy
    else:  # its command, the policy as make would pass it
        assert f"teacher.policy_file={policy}" in train.args


def test_arco_trains_from_its_warmups_folder(tmp_path):
    stages = runner.arco_plan(_setup("arco/configs/llama3.2_3b_hotpotqa.yaml", tmp_path))
    assert [s.name for s in stages][:3] == ["warmup", "train", "resume"]
    warmup = str(tmp_path / "runs" / "arco" / "warmup")
    for stage in stages[:2]:
        assert f"warmup_dir={warmup}" in stage.args
    assert stages[0].make == "warmup-arco" and stages[0].make_vars is not None


def test_make_vars_pick_the_config_the_makefile_picks():
    assert make_vars("eviback/configs/qwen3_0.6b.yaml") == {"METHOD": "eviback", "SCALE": "0.6b"}
    assert make_vars("cer/configs/qwen3_8b_base_webinstruct.yaml") == {
        "METHOD": "cer", "SCALE": "8b", "DATA": "webinstruct"
    }  # fmt: skip
    assert make_vars("arco/configs/llama3.2_3b_2wiki.yaml", "prm") == {
        "METHOD": "arco", "SCALE": "llama3.2-3b", "DATA": "2wiki", "VARIANT": "prm"
    }  # fmt: skip
    with pytest.raises(ValueError, match="no SCALE/DATA"):
        make_vars("eviback/configs/tiny_allzero.yaml")
    # the Makefile's dry run resolves the same config, overrides in ARGS
    config = "arco/configs/llama3.2_3b_2wiki.yaml"
    key = tuple(sorted(make_vars(config, "prm").items()))
    assert runs_through_make("warmup-arco", key, config)
    assert not runs_through_make("warmup-arco", key, "arco/configs/qwen3_4b_2wiki.yaml")


def test_args_survive_make_and_the_shell_word_for_word():
    overrides = ["assets.train_quotas={nq: 4, hotpotqa: 4}", "note=it's $5", "run_dir=/a b"]
    argv = make_argv("ape-eviback", {"SCALE": "0.6b"}, overrides)
    run = subprocess.run(
        ["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, check=True
    )
    line = next(ln for ln in run.stdout.splitlines() if "eviback ape" in ln)
    # the recipe line as the shell parses it: the same words
    shown = subprocess.run(
        ["sh", "-c", f"printf '%s\\n' {line.split('--config eviback/configs/qwen3_0.6b.yaml')[1]}"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert shown == overrides


def test_config_overrides_are_what_follows_the_options():
    args = ["train", "--config", "c.yaml", "--variant", "prm", "a=1", "b=x y"]
    assert config_overrides(args) == ["a=1", "b=x y"]
    assert config_overrides(["--config", "c.yaml", "--wait-s", "60", "k=v"]) == ["k=v"]
    assert config_overrides(["ape", "--config", "c.yaml"]) == []


def test_a_stage_through_make_runs_as_the_readme_types_it():
    stage = Stage("ape", "eviback", ["ape", "--config", "c.yaml", "x=1"], make="ape-eviback",
                  make_vars={"SCALE": "1.7b"})  # fmt: skip
    argv = command_line(stage)
    assert argv[2:] == ["ape-eviback", f"PY={sys.executable}",
                        f"VENV={Path(sys.executable).parent.parent}", "SCALE=1.7b", "ARGS=x=1"]  # fmt: skip
    stage.make_vars = None  # a target without ARGS=: the command it runs
    assert command_line(stage) == [sys.executable, "-m", "eviback", "ape", "--config", "c.yaml",
                                   "x=1"]  # fmt: skip
    stage.make_vars, stage.ranks = {"SCALE": "1.7b"}, 2
    assert {"GPUS=2", "DS_ARGS=--master_port 2345"} <= set(command_line(stage, 2345))


def _pids(log: Path) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines()[1:]
        if len(lines) >= 2:
            return [int(x) for x in lines[:2]]
        time.sleep(0.05)
    raise AssertionError(f"the service did not start: {log.read_text()}")


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")


def test_a_background_service_is_stopped_with_its_children_when_the_block_fails(tmp_path):
    log = tmp_path / "service.log"
    # a shell (make's part) whose child (the server) ignores SIGTERM: SIGKILL follows
    script = "sh -c 'trap \"\" TERM; echo $$; exec sleep 300' & echo $$; wait"
    service = background(["sh", "-c", script], log, dict(os.environ), grace_s=1.0)
    with pytest.raises(RuntimeError, match="stage failed"), service as proc:
        pids = _pids(log)
        raise RuntimeError("stage failed")
    assert not group_alive(proc.pid)
    assert all(_gone(pid) for pid in pids)
    assert log.read_text().startswith("$ sh -c ")


def test_a_background_service_that_exits_first_is_stopped_quietly(tmp_path):
    with background(["sh", "-c", "exit 3"], tmp_path / "s.log", dict(os.environ)) as proc:
        proc.wait(timeout=10)
    assert proc.returncode == 3 and not group_alive(proc.pid)


def test_an_outer_makes_variables_do_not_reach_the_rehearsals_make_commands():
    env = {"MAKEFLAGS": "-- VARIANT=prm", "MAKELEVEL": "1", "MFLAGS": "", "PATH": "/bin"}
    assert without_make_env(env) == {"PATH": "/bin"}
    outer = dict(os.environ, MAKEFLAGS="-- VARIANT=prm", MAKELEVEL="1")
    argv = make_argv("warmup-arco", {"SCALE": "qwen3-4b", "DATA": "hotpotqa"})
    for env_, variant in ((outer, True), (without_make_env(outer), False)):
        run = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, env=env_, capture_output=True,
                             text=True, check=True)  # fmt: skip
        assert ("--variant prm" in run.stdout) is variant


def test_the_report_lists_each_steps_make_target_and_what_was_not_run():
    from experiments.rehearse.stages import StageResult

    report = runner.Report("eviback/configs/qwen3_0.6b.yaml", None, 1, "cpu")
    report.setup = [
        StageResult("data", True, 1.0, 0.0, "d.log", 0, command="prepare", make="data"),
        StageResult("serve-retrieval", True, 0.0, 0.0, "s.log", command="make x serve-retrieval",
                    make="serve-retrieval"),
    ]  # fmt: skip
    report.stages = [
        StageResult("train", True, 2.0, 10.0, "t.log", 0, command="python -m eviback train",
                    make="train-eviback"),
        StageResult("resume", False, 2.0, 10.0, "r.log", 1, "exit status 1: boom",
                    command="python -m eviback train"),
    ]  # fmt: skip
    assert report.walk == ["data", "serve-retrieval", "train-eviback"]
    assert report.failed == ["resume"] and not report.ok
    text = report.markdown()
    assert "| serve-retrieval | `make serve-retrieval` | ok |" in text
    assert "| train | `make train-eviback`, its command | ok |" in text
    assert "| resume | (rehearsal) | FAILED: exit status 1: boom |" in text
    assert "Ran, in order: `make data`, `make serve-retrieval`, `make train-eviback`." in text
    assert "Not run: `make gpu-check`: needs a GPU" in text
    report.stages[1].ok = True
    report.setup[1].ok = False  # a service that stopped before the rehearsal did
    assert report.failed == ["serve-retrieval"] and not report.ok
