"""Checkpoints: exact resume, HF loadability, atomic commit under a crash, retention."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
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
