"""Checkpoints: exact resume, HF loadability, atomic commit under a crash, retention."""

from __future__ import annotations

import errno
import json
import math
import os
import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from peft import PeftModel
from tokenizers import Tokenizer, models, pre_tokenizers

from common.train import (
    TrainConfig,
    TrainEngine,
    build_lora_model,
    export_hf_state_dict,
    find_latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from common.train.checkpoint import (
    CheckpointSaveError,
    CheckpointSpaceError,
    check_checkpoint_space,
    checkpoint_bytes,
    planned_saves,
)

QWEN3 = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
)
ADAPTER = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    """These tests check exact fp32 arithmetic: keep the engine on CPU on a GPU machine too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def tiny_qwen3() -> transformers.Qwen3ForCausalLM:
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3))


def build_engine(kind: str = "full", bf16: bool = False) -> TrainEngine:
    model = tiny_qwen3()
    if kind == "lora":
        model = build_lora_model(model, {"policy": ADAPTER, "rubric": ADAPTER})
    config = TrainConfig(
        lr=1e-2,
        weight_decay=0.01,
        warmup_steps=2,
        scheduler="linear",
        total_steps=8,
        grad_accum=2,
        max_grad_norm=0.5,
        bf16=bf16,
    )
    return TrainEngine(model, config)


class SyntheticStream:
    """Batches whose length, order and tokens come from the python, numpy and torch RNGs."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self) -> torch.Tensor:
        self.position += 1
        seq = random.randint(4, 9)
        batch = torch.randint(0, 97, (2, seq))
        return batch[np.random.permutation(2)]

    def state(self) -> dict:
        return {"position": self.position}


def train(engine: TrainEngine, stream: SyntheticStream, steps: int) -> None:
    lora = hasattr(engine.model, "peft_config")
    for _ in range(steps * engine.config.grad_accum):
        if lora:  # alternate adapters as ARCO alternates policy and rubric losses
            engine.set_adapter(random.choice(["policy", "rubric"]))
        batch = stream.next_batch()
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()


def assert_same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys() and sa["state"]
    for index, values in sa["state"].items():
        for key, value in values.items():
            assert torch.equal(value, sb["state"][index][key]), (index, key)


def weights(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


@pytest.mark.parametrize(("kind", "bf16"), [("full", False), ("full", True), ("lora", False)])
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path, kind, bf16):
    straight, stream = build_engine(kind, bf16), SyntheticStream()
    train(straight, stream, 6)

    first, first_stream = build_engine(kind, bf16), SyntheticStream()
    train(first, first_stream, 3)
    save_checkpoint(first, tmp_path, 3, first_stream.state())
    del first

    resumed, resumed_stream = build_engine(kind, bf16), SyntheticStream()
    data_state = load_checkpoint(resumed, find_latest_checkpoint(tmp_path))
    assert data_state == {"position": 6}  # 3 steps x 2 micro-batches
    resumed_stream.position = data_state["position"]
    assert resumed.global_step == 3
    train(resumed, resumed_stream, 3)

    assert resumed.global_step == straight.global_step == 6
    expected = weights(straight)
    assert all(torch.equal(p, expected[n]) for n, p in weights(resumed).items())
    assert_same_optimizer_state(straight.optimizer, resumed.optimizer)
    assert resumed.lr == straight.lr


def test_checkpoint_is_a_loadable_hf_model_with_tokenizer(tmp_path):
    engine, stream = build_engine(), SyntheticStream()
    train(engine, stream, 1)
    vocab = {f"t{i}": i for i in range(97)} | {"[UNK]": 96}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    path = save_checkpoint(engine, tmp_path, 1, stream.state(), tokenizer=tokenizer)

    assert path == tmp_path / "checkpoints" / "step_1"
    assert (path / "model.safetensors").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    expected = export_hf_state_dict(engine)
    assert all(torch.equal(loaded.state_dict()[n], t) for n, t in expected.items())
    reloaded_tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert reloaded_tokenizer("t5 t7")["input_ids"] == [5, 7]


def test_lora_checkpoint_holds_each_adapter_and_the_merged_policy(tmp_path):
    engine, stream = build_engine("lora"), SyntheticStream()
    train(engine, stream, 2)
    path = save_checkpoint(engine, tmp_path, 2, stream.state(), merge_adapter="policy")

    batch = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(0))
    engine.model.eval()
    for adapter in ("policy", "rubric"):
        peft_model = PeftModel.from_pretrained(tiny_qwen3(), path / "adapters" / adapter).eval()
        engine.set_adapter(adapter)
        with torch.no_grad():
            expected = engine.model(input_ids=batch).logits
            assert torch.allclose(peft_model(input_ids=batch).logits, expected, atol=1e-6)
    merged = transformers.AutoModelForCausalLM.from_pretrained(path)
    policy = export_hf_state_dict(engine, adapter="policy")
    assert all(torch.equal(merged.state_dict()[n], t) for n, t in policy.items())

    unmerged = save_checkpoint(engine, tmp_path, 3, stream.state())
    assert not (unmerged / "config.json").exists()
    assert (unmerged / "adapters" / "rubric" / "adapter_model.safetensors").is_file()


def test_crash_while_committing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    engine, stream = build_engine(), SyntheticStream()
    train(engine, stream, 1)
    save_checkpoint(engine, tmp_path, 1, stream.state())
    saved = weights(engine)
    train(engine, stream, 1)

    real_replace = os.replace

    def crash_on_step_2(src, dst):
        if Path(dst).name == "step_2":
            raise OSError("disk full (injected)")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_step_2)
    with pytest.raises(OSError, match="injected"):
        save_checkpoint(engine, tmp_path, 2, stream.state())
    monkeypatch.setattr(os, "replace", real_replace)

    checkpoints = tmp_path / "checkpoints"
    assert [p.name for p in checkpoints.glob("step_2.tmp-*")]  # the half-committed folder
    latest = find_latest_checkpoint(tmp_path)
    assert latest == checkpoints / "step_1"
    fresh = build_engine()
    assert load_checkpoint(fresh, latest) == {"position": 2}
    assert all(torch.equal(p, saved[n]) for n, p in weights(fresh).items())

    save_checkpoint(engine, tmp_path, 2, stream.state())
    assert find_latest_checkpoint(tmp_path) == checkpoints / "step_2"
    assert not list(checkpoints.glob("step_2.tmp-*"))  # leftovers of the crash cleaned


def test_find_latest_ignores_incomplete_and_temporary_folders(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    assert find_latest_checkpoint(tmp_path) is None
    for name, complete in [("step_2", True), ("step_10", True), ("step_11", False)]:
        (checkpoints / name).mkdir(parents=True)
        if complete:
            (checkpoints / name / "COMPLETE").write_text("")
    (checkpoints / "step_12.tmp-99").mkdir()
    (checkpoints / "step_12.tmp-99" / "COMPLETE").write_text("")
    assert find_latest_checkpoint(tmp_path) == checkpoints / "step_10"  # numeric, not lexical
    (checkpoints / "latest").write_text("step_2\n")
    assert find_latest_checkpoint(tmp_path) == checkpoints / "step_2"
    (checkpoints / "latest").write_text("step_11\n")  # points at an incomplete folder
    assert find_latest_checkpoint(tmp_path) == checkpoints / "step_10"


def test_keep_last_removes_the_oldest_checkpoints(tmp_path):
    engine, stream = build_engine(), SyntheticStream()
    for step in range(1, 5):
        train(engine, stream, 1)
        save_checkpoint(engine, tmp_path, step, stream.state(), keep_last=2)
    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_3", "step_4"]
    assert (checkpoints / "latest").read_text() == "step_4\n"


def test_saving_does_not_change_the_random_streams(tmp_path):
    engine, stream = build_engine(), SyntheticStream()
    train(engine, stream, 1)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    save_checkpoint(engine, tmp_path, 1, stream.state())
    assert random.getstate() == before[0]
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])


def test_bad_calls_are_clear_errors(tmp_path):
    engine, stream = build_engine(), SyntheticStream()
    with pytest.raises(ValueError, match="keep_last=0"):
        save_checkpoint(engine, tmp_path, 1, {}, keep_last=0)
    with pytest.raises(ValueError, match="data_state is not JSON-serialisable"):
        save_checkpoint(engine, tmp_path, 1, {"sampler": object()})
    batch = stream.next_batch()
    engine.backward(engine(input_ids=batch, labels=batch).loss)
    engine.step()  # 1 of grad_accum=2 micro-batches
    with pytest.raises(ValueError, match="gradient of 1 micro-batches not yet stepped"):
        save_checkpoint(engine, tmp_path, 1, {})
    assert not list((tmp_path / "checkpoints").glob("step_1*"))
    with pytest.raises(ValueError, match="no COMPLETE marker"):
        load_checkpoint(engine, tmp_path / "checkpoints" / "step_1")


def test_loading_into_a_different_world_size_is_refused(tmp_path):
    engine = build_engine()
    path = save_checkpoint(engine, tmp_path, 0, {})
    state = json.loads((path / "trainer_state.json").read_text())
    (path / "trainer_state.json").write_text(json.dumps(state | {"world_size": 2}))
    with pytest.raises(ValueError, match="written by 2 ranks, loading into 1"):
        load_checkpoint(build_engine(), path)


# ---- a full disk ------------------------------------------------------------------------------

TORCH_ENFORCE = (  # what torch.save raises when the disk fills: no errno, no "space"
    "[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
    "data/0: file write failed"
)


@pytest.mark.parametrize(
    ("error", "free_gib"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), 0.25),
        (RuntimeError(TORCH_ENFORCE), 0.0),  # told apart by the free space: none left
    ],
    ids=["ENOSPC", "torch-enforce"],
)
def test_a_full_disk_mid_save_removes_the_partial_folder_and_keeps_latest(
    tmp_path, monkeypatch, error, free_gib
):
    """The disk fills while the optimizer state is written (the HF weights already are): the
    partial folder goes, ``latest`` still names step 1 (which loads), and the error says "no
    space left on device", the folder and the free GiB."""
    engine, stream = build_engine(), SyntheticStream()
    train(engine, stream, 1)
    save_checkpoint(engine, tmp_path, 1, stream.state())
    train(engine, stream, 1)
    checkpoints = tmp_path / "checkpoints"
    real_save, seen = safetensors.torch.save_file, []

    def full_disk(obj, f, *args, **kwargs):
        folder = Path(f).parents[1]
        seen.append((folder, (folder / "model.safetensors").is_file()))
        Path(f).write_bytes(b"\0" * 1000)  # half a file, as a write cut short leaves it
        raise error

    usage = shutil.disk_usage(tmp_path)
    free = int(free_gib * 2**30)
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)  # the optimizer state's
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=free))
    with pytest.raises(CheckpointSaveError) as caught:
        save_checkpoint(engine, tmp_path, 2, stream.state())
    monkeypatch.setattr(safetensors.torch, "save_file", real_save)
    [(tmp, weights_written)] = seen
    assert weights_written and tmp.name.startswith("step_2.tmp-")
    msg = str(caught.value)
    assert "no space left on device" in msg and str(tmp) in msg
    assert f"{free_gib:.2f} GiB free" in msg and "`latest` still names step_1" in msg
    assert caught.value.errno == errno.ENOSPC and caught.value.__cause__ is error
    assert not tmp.exists() and sorted(p.name for p in checkpoints.iterdir()) == [
        "latest",
        "step_1",
    ]
    assert (checkpoints / "latest").read_text() == "step_1\n"
    assert find_latest_checkpoint(tmp_path) == checkpoints / "step_1"
    assert load_checkpoint(build_engine(), checkpoints / "step_1") == {"position": 2}


def test_other_errors_mid_save_remove_the_partial_folder_too(tmp_path, monkeypatch):
    """An I/O error that is not a full disk names its own cause; a bug (not I/O) is raised as
    it is; either way no partial folder stays."""
    engine = build_engine()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=100 * 2**30))
    for error, kind in [
        (OSError(errno.EACCES, "Permission denied"), CheckpointSaveError),
        (KeyError("a bug"), KeyError),
    ]:

        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(safetensors.torch, "save_file", fail)
        with pytest.raises(kind) as caught:
            save_checkpoint(engine, tmp_path, 1, {})
        if kind is CheckpointSaveError:
            msg = str(caught.value)
            assert "Permission denied" in msg and "no space" not in msg
            assert "100.00 GiB free" in msg and "there is no earlier checkpoint" in msg
        assert not list((tmp_path / "checkpoints").iterdir())


def test_a_killed_save_s_leftover_is_removed_before_the_next_save_writes(tmp_path, monkeypatch):
    """A save killed mid-write leaves step_N.tmp-<pid> (another pid): the next save removes it
    before writing, so its space is free for the new checkpoint."""
    engine = build_engine()
    leftover = tmp_path / "checkpoints" / "step_3.tmp-99999"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "train_state.safetensors").write_bytes(b"\0" * 4096)
    real_save, seen = safetensors.torch.save_file, []

    def spy(obj, f, *args, **kwargs):
        seen.append(leftover.exists())
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", spy)
    save_checkpoint(engine, tmp_path, 4, {})
    assert seen and not any(seen)


@pytest.mark.parametrize(("kind", "bf16"), [("full", False), ("full", True), ("lora", False)])
def test_checkpoint_bytes_counts_weights_and_adam_state(tmp_path, kind, bf16):
    """By hand: a full fp32 model saves 4 bytes a parameter of weights and 4 + 8 of state
    (itself, two moments); bf16: 2 + (2 + 4 master + 8); a LoRA model only its LoRA
    weights, 4 + 4 + 8 each. A tiny model's real checkpoint is that plus small files."""
    engine = build_engine(kind, bf16)
    params = dict(engine.model.named_parameters())
    n = sum(p.numel() for p in params.values())
    lora = sum(p.numel() for name, p in params.items() if "lora_" in name)
    expected = {("full", False): 16 * n, ("full", True): 16 * n, ("lora", False): 16 * lora}
    assert checkpoint_bytes(engine) == expected[kind, bf16]
    train(engine, SyntheticStream(), 1)
    path = save_checkpoint(engine, tmp_path, 1, {})
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    assert checkpoint_bytes(engine) <= on_disk < checkpoint_bytes(engine) + 64 * 2**10


def test_planned_saves_follow_the_run_s_schedule():
    assert planned_saves(100, 25) == 4  # 25, 50, 75, 100
    assert planned_saves(10, 0) == 1  # the last step only
    assert planned_saves(10, 3) == 4  # 3, 6, 9 and the last, 10
    assert planned_saves(10, 3, start=7) == 2  # resumed at 7: 9, 10
    assert planned_saves(10, 5, start=11) == 0  # resumed after the last step


def test_check_checkpoint_space_by_hand(tmp_path, monkeypatch, capsys):
    """1 GiB a checkpoint, keep_checkpoints=2 and 10 saves: 3 at once on disk at most (the new
    one is written before the oldest goes), so 3 GiB; under 1.5 x that (4.5 GiB) a warning."""
    gib = 2**30
    usage = shutil.disk_usage(tmp_path)
    free = {"bytes": 0}
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=free["bytes"]))

    free["bytes"] = int(2.9 * gib)
    with pytest.raises(CheckpointSpaceError) as caught:
        check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=10)
    msg = str(caught.value)
    assert "3 checkpoints of about 1.00 GiB (3.00 GiB; keep_checkpoints=2" in msg
    assert "2.90 GiB free" in msg and str(tmp_path / "run" / "checkpoints") in msg
    assert "lower keep_checkpoints" in msg

    free["bytes"] = 4 * gib  # fits, under 1.5 x
    assert check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=10) == pytest.approx(4 / 3)
    assert "warning: little disk space to spare" in capsys.readouterr().out
    free["bytes"] = 5 * gib
    assert check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=10) == pytest.approx(5 / 3)
    assert capsys.readouterr().out == ""

    # every save kept (keep=None): save_every=25 over 100 steps is 4 checkpoints, 4 GiB
    free["bytes"] = int(3.9 * gib)
    with pytest.raises(CheckpointSpaceError, match=r"4 checkpoints .*keep_checkpoints=None.* 3.90"):
        check_checkpoint_space(tmp_path / "run", gib, None, planned_saves(100, 25))
    free["bytes"] = 1 * gib  # one save (the last step only): 1 GiB fits, with no margin
    assert check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=1) == pytest.approx(1)
    # resumed with 2 kept on disk already: they take no new space, the next save needs 1 GiB
    for step in ("step_1", "step_2"):
        (tmp_path / "run" / "checkpoints" / step).mkdir(parents=True)
        (tmp_path / "run" / "checkpoints" / step / "COMPLETE").write_text("")
    assert check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=8) == pytest.approx(1)
    free["bytes"] = gib // 2
    with pytest.raises(CheckpointSpaceError, match=r"1 checkpoint of .* 2 on disk already"):
        check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=8)
    assert check_checkpoint_space(tmp_path / "run", gib, keep=2, saves=0) == math.inf


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of ``size`` bytes mounted at a folder (root with mount rights only; else skip)."""
    mounted = []

    def mount(size: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
            pytest.skip("mounting a tmpfs needs root")
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"mounting a tmpfs is not permitted here: {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:  # lazily if still busy: never left mounted
        if subprocess.run(["umount", str(point)]).returncode != 0:
            subprocess.run(["umount", "-l", str(point)], check=True)


def test_a_real_full_disk_mid_save(tmp_path, small_disk):
    """On a real small disk (a tmpfs one and a half checkpoints big): the second checkpoint
    fills it; the save stops with "no space left on device", its partial folder is gone (the
    space is free again) and the first checkpoint is still the latest and loads."""
    engine, stream = build_engine(), SyntheticStream()
    train(engine, stream, 1)
    size = checkpoint_bytes(engine) + 64 * 2**10  # the estimate and the small files
    disk = small_disk(int(1.5 * size))
    free_before = shutil.disk_usage(disk).free
    save_checkpoint(engine, disk, 1, stream.state())
    train(engine, stream, 1)
    free_after_one = shutil.disk_usage(disk).free
    with pytest.raises(CheckpointSaveError, match="no space left on device") as caught:
        save_checkpoint(engine, disk, 2, stream.state())
    assert "GiB free on its disk" in str(caught.value)
    checkpoints = disk / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_1"]
    assert shutil.disk_usage(disk).free == free_after_one < free_before
    assert find_latest_checkpoint(disk) == checkpoints / "step_1"
    assert load_checkpoint(build_engine(), checkpoints / "step_1") == {"position": 2}


def test_a_resume_on_another_rank_count_is_refused_before_anything_loads(tmp_path):
    from common.config import ConfigError
    from common.train.checkpoint import check_resume_ranks

    step = tmp_path / "step_40"
    step.mkdir()
    (step / "trainer_state.json").write_text(json.dumps({"world_size": 8, "global_step": 40}))
    check_resume_ranks(step, 8)
    check_resume_ranks(None, 4)
    with pytest.raises(
        ConfigError,
        match=r"step_40 was written by 8 rank\(s\) and this start has 4: resume on 8 \(GPUS=8",
    ):
        check_resume_ranks(step, 4)
    (step / "trainer_state.json").write_text("{")  # load_checkpoint names an unreadable state
    check_resume_ranks(step, 4)
