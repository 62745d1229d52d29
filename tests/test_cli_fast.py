"""A command line answers at once: ``--help`` of every command and a config error load none of
torch, transformers, peft, vLLM or DeepSpeed (config modules are torch-free, package
``__init__``s lazy, trainers imported inside the command that runs them), and the console
scripts find their default configs from any directory.

Each check runs in a fresh interpreter (this one has torch loaded by other tests). The wall time
of ``--help`` is printed (``pytest -s``), not asserted: it depends on the machine (about 0.2 s
here, against 5-8 s when the config modules loaded torch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "peft", "vllm", "deepspeed")
# ``main(argv)`` of a module in a fresh interpreter, then the heavy modules it left loaded
PROBE = """
import contextlib, importlib, io, json, sys
module, argv = sys.argv[1], sys.argv[2:]
main = importlib.import_module(module).main
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
except SystemExit as e:
    code = e.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
print(json.dumps({"code": code, "heavy": heavy, "out": out.getvalue()}))
""".replace("HEAVY", repr(HEAVY))
HELP = [
    ("arco.cli", ["--help"]),
    ("arco.cli", ["train", "--help"]),
    ("cer.cli", ["--help"]),
    ("cer.cli", ["train", "--help"]),
    ("eviback.cli", ["--help"]),
    ("eviback.cli", ["warmup", "--help"]),
    ("eviback.cli", ["train", "--help"]),
    ("common.warmup", ["--help"]),
    ("common.search_grpo", ["--help"]),
]
BAD_KEY = [
    ("arco.cli", ["train", "key_that_does_not_exist=1"]),
    ("cer.cli", ["train", "key_that_does_not_exist=1"]),
    ("eviback.cli", ["train", "key_that_does_not_exist=1"]),
    ("eviback.cli", ["warmup", "key_that_does_not_exist=1"]),
    ("common.warmup", ["key_that_does_not_exist=1"]),
    ("common.search_grpo", ["key_that_does_not_exist=1"]),
    ("eviback.cli", ["train", "assets.train_files={nq: nq.jsonl}"]),  # a renamed key
]
CONFIG_MODULES = [
    "common.config",
    "common.run_config",
    "common.grpo_config",
    "common.rewards",
    "common.train.config",
    "common.rollout.agent",
    "arco.config",
    "cer.config",
    "eviback.config",
]


def _probe(module: str, argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _id(x):
    return " ".join(x) if isinstance(x, list) else x


@pytest.mark.parametrize(("module", "argv"), HELP, ids=_id)
def test_help_loads_no_heavy_module(module, argv):
    got = _probe(module, argv)
    assert got["code"] == 0 and got["out"].startswith("usage: ")
    assert got["heavy"] == [], f"{module} {argv} loaded {got['heavy']}"


@pytest.mark.parametrize(("module", "argv"), BAD_KEY, ids=_id)
def test_a_config_error_is_one_line_without_heavy_modules(module, argv):
    got = _probe(module, argv)
    assert got["code"] == 2
    line = got["out"].strip()
    assert "\n" not in line and "config key" in line, line
    assert got["heavy"] == [], f"{module} {argv} loaded {got['heavy']}"


@pytest.mark.parametrize("module", CONFIG_MODULES)
def test_config_modules_are_torch_free(module):
    code = f"import sys, {module}; print(sorted(m for m in {list(HEAVY)!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"import {module} loaded {done.stdout.strip()}"


def test_every_builtin_reward_and_estimator_resolves():
    """``RewardConfig`` resolves a built-in name only when the trainer asks (so building the
    defaults loads no torch): every one of them must resolve."""
    from cer.config import BUILTIN_REWARDS
    from cer.config import RewardConfig as CERRewardConfig
    from common.grpo_config import GRPORewardConfig
    from common.rewards import load_part
    from eviback.config import EviBackRewardConfig

    for cls in (GRPORewardConfig, EviBackRewardConfig):
        for name in cls.REWARDS:
            load_part(name, "reward.fn", "reward", cls.REWARDS)
        for name in cls.ESTIMATORS:
            load_part(name, "reward.advantage", "estimator", cls.ESTIMATORS)
    for name in BUILTIN_REWARDS:
        CERRewardConfig(fn=name).reward_fn()


def _script(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)] if script.is_file() else [sys.executable, "-m", name]


@pytest.mark.parametrize("name", ["arco", "cer", "eviback"])
def test_console_script_help_time_and_any_directory(name, tmp_path):
    """From a directory outside the repository: the default config is found next to the
    package (a bad key fails on the key, not on a missing file), and --help is timed."""
    cmd = _script(name)
    if cmd[0] == sys.executable:  # python -m needs the repository on the path
        pytest.skip("the project is not pip-installed in this environment")
    start = time.perf_counter()
    done = subprocess.run([*cmd, "--help"], cwd=tmp_path, capture_output=True, text=True)
    took = time.perf_counter() - start
    assert done.returncode == 0 and done.stdout.startswith(f"usage: {name} ")
    print(f"\n{name} --help: {took:.2f} s (from {tmp_path})")
    commands = ["train", "warmup"] if name == "eviback" else ["train"]
    for command in commands:
        done = subprocess.run(
            [*cmd, command, "key_that_does_not_exist=1"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2
        assert "unknown config key 'key_that_does_not_exist'" in done.stderr, done.stderr
