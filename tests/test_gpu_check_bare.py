"""``make gpu-check-bare``: its verdicts and readings, the wheelhouse's install on a node without
an index, and the whole check at tiny widths on this CPU (so the script cannot rot)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from experiments.gpu_check_bare import (
    GAP_LIMIT,
    PLAN_FLOOR,
    STAGES,
    Stage,
    config_stages,
    mfu,
    storages_bytes,
    tiny_widths,
    within_plan,
)
from scripts.wheelhouse import install, missing

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def test_within_plan_allows_the_slack_and_no_more():
    assert within_plan(10 * GiB, 10 * GiB)
    assert within_plan(11.5 * GiB, 10 * GiB)  # 15% over
    assert not within_plan(11.6 * GiB, 10 * GiB)
    # a small plan gets the floor: allocator rounding is not a fault
    assert within_plan(PLAN_FLOOR, 0)
    assert not within_plan(PLAN_FLOOR + 1, 0)


def test_mfu_is_model_flops_over_the_peak():
    widths = tiny_widths()
    arch = widths.policy  # hidden 64, 2 layers, 4 heads of 16, FFN 128, vocab 512, tied
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64 + 2 * 16
    non_embedding = 2 * layer + 64
    assert arch.params() - 512 * 64 == non_embedding
    per_token = 6 * non_embedding + 6 * 2 * 4 * 16 * 100
    assert mfu(1e6, arch, 100, "NVIDIA H100 80GB HBM3") == pytest.approx(1e6 * per_token / 989e12)
    assert mfu(1e6, arch, 100, "some CPU") is None


def test_storages_counts_a_view_with_its_base_once():
    a = torch.zeros(100)  # 400 bytes
    b = torch.zeros(10, dtype=torch.float64)  # 80 bytes
    assert storages_bytes(iter([a, a[10:20], a.view(10, 10), b, torch.empty(0)])) == 480


def test_the_configured_zero_stages_are_found():
    stages = config_stages()
    assert set(stages) == {2, 3}
    assert "eviback/configs/qwen3_1.7b.yaml" in stages[2]
    assert "cer/configs/qwen3_4b_base_math.yaml" in stages[3]


def test_a_stage_fails_on_any_failed_check_or_an_error():
    s = Stage("x")
    assert not s.ok  # nothing checked is not a pass
    s.check("a", True, "fine")
    s.check("b", False, "2.0 GiB over")
    assert not s.ok and s.line().endswith("FAIL x (0 s): b: 2.0 GiB over")
    t = Stage("y", error="RuntimeError: boom")
    t.check("a", True, "fine")
    assert not t.ok and "FAIL y: RuntimeError: boom" in t.line()


def _wheel(folder: Path, name: str, module: str) -> Path:
    """A real (minimal) wheel of a one-module distribution."""
    stem = name.replace("-", "_")  # a wheel's file and folder names spell it with underscores
    dist = f"{stem}-1.0.dist-info"
    files = {
        f"{module}.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{stem}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name_, data in files.items():
            z.writestr(name_, data)
    return path


@pytest.mark.slow
def test_wheelhouse_installs_only_what_the_node_lacks(tmp_path, capsys):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    _wheel(house, "bare-probe-pkg", "bare_probe_mod")
    manifest = {"packages": {"bare-probe-pkg": "bare_probe_mod", "packaging": "packaging"}}
    (house / "manifest.json").write_text(json.dumps(manifest))
    assert missing(manifest["packages"]) == ["bare-probe-pkg"]  # packaging is here already
    target = tmp_path / "deps"
    assert install(house, target) == 0
    assert (target / "bare_probe_mod.py").read_text() == "VALUE = 42\n"
    assert not (target / "packaging").exists()  # the node's own is never shadowed
    assert "installed ['bare-probe-pkg']" in capsys.readouterr().out
    assert install(house, target) == 0  # a second install finds it in the target
    assert "installed nothing" in capsys.readouterr().out
    sys.path.remove(str(target))


def test_wheelhouse_install_without_a_wheelhouse_says_how_to_build_one(tmp_path, capsys):
    assert install(tmp_path / "none", tmp_path / "deps") == 2
    assert "python scripts/wheelhouse.py build" in capsys.readouterr().err


def test_the_check_refuses_a_cpu_without_allow_cpu():
    run = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_check_bare"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 2 and "--allow-cpu" in run.stderr


@pytest.mark.slow
def test_the_bare_check_passes_at_tiny_widths_on_cpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    run = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_check_bare", "--allow-cpu", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "CUDA_VISIBLE_DEVICES": ""},
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("[gpu-check-bare]")]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert [ln.split()[2] for ln in lines[:-1]] == list(STAGES)
    assert all(" PASS " in ln for ln in lines[:-1]), lines
    report = json.loads((tmp_path / "gpu_check_bare.json").read_text())
    assert report["widths"] == "tiny" and report["failed"] == 0
    stages = {s["name"]: s for s in report["stages"]}
    # the control shows the gap limit catches bf16 rotary buffers; the real gap is under it
    gap = stages["logprob_gap"]["data"]
    assert gap["gap"] <= GAP_LIMIT < gap["control_gap"]
    # the configured ZeRO stages built ZeRO's optimizers and skipped the NaN step bit-identically
    ds = stages["deepspeed"]["data"]
    assert ds["zero2"] == {"optimizer": "DeepSpeedZeroOptimizer", "nan_skipped": True, "same": True}
    assert ds["zero3"]["optimizer"] == "DeepSpeedZeroOptimizer_Stage3" and ds["zero3"]["same"]
    # checkpointed μ saves well under half of what it saves without
    mu = stages["arco_mu"]["data"]
    assert 0 < mu["saved_on_bytes"] < 0.5 * mu["saved_off_bytes"]
    width = stages["width"]["data"]
    assert len(width["micro_batch_peaks_gib"]) == len(tiny_widths().lengths)
    assert (tmp_path / "gpu_check_bare.txt").read_text().splitlines() == lines
