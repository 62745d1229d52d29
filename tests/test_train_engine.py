"""TrainEngine (plain path here, DeepSpeed in the two-rank test), LoRA adapters, reference, export."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from common.train import (
    ReferenceModel,
    TrainConfig,
    TrainEngine,
    build_lora_model,
    export_hf_state_dict,
    iter_named_weights,
    load_for_training,
)
from common.train.engine import deepspeed_config

SCRIPT = Path(__file__).parent / "scripts" / "ds_two_ranks.py"
_spec = importlib.util.spec_from_file_location("ds_two_ranks", SCRIPT)
ds_two_ranks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ds_two_ranks)
tiny_qwen3 = ds_two_ranks.tiny_qwen3
ADAPTER = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    """These tests check exact fp32 arithmetic: keep the engine on CPU on a GPU machine too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def linear(weight: list[float]) -> torch.nn.Linear:
    layer = torch.nn.Linear(len(weight), 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([weight]))
    return layer


def ids(seed: int, batch: int = 2, seq: int = 8) -> torch.Tensor:
    return torch.randint(0, 97, (batch, seq), generator=torch.Generator().manual_seed(seed))


def lm_step(engine: TrainEngine, seed: int) -> dict:
    batch = ids(seed)
    engine.backward(engine(input_ids=batch, labels=batch).loss)
    return engine.step()


def lora_model() -> torch.nn.Module:
    return ds_two_ranks.build_model(lora=True)


# --- TrainConfig -------------------------------------------------------------------------------


def test_every_config_field_has_help():
    assert all(f.metadata.get("help") for f in dataclasses.fields(TrainConfig))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", 0.0),
        ("betas", (0.9,)),
        ("betas", (0.9, 1.0)),
        ("scheduler", "cosine_with_restarts"),
        ("grad_accum", 0),
        ("max_grad_norm", -1.0),
        ("zero_stage", 4),
        ("bf16", "yes"),
        ("warmup_steps", -1),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"{field}="):
        TrainConfig(**{field: value})


def test_config_takes_betas_as_a_yaml_list():
    assert TrainConfig(betas=[0.9, 0.95]).betas == (0.9, 0.95)


def test_bf16_auto_is_fp32_on_cpu():
    assert TrainConfig().use_bf16(torch.device("cpu")) is False
    assert TrainConfig(bf16=True).use_bf16(torch.device("cpu")) is True
    assert TrainConfig().weights_dtype() is torch.float32  # auto, and no GPU (cpu_only)
    assert TrainConfig(bf16=True).weights_dtype() is torch.bfloat16


def test_a_model_loads_straight_in_the_dtype_training_holds_it_in(tmp_path):
    """bf16 training loads bf16 weights (no fp32 copy first), equal to an fp32 load cast by the
    engine; fp32 training loads fp32, equal to the saved weights."""
    model = tiny_qwen3()
    model.save_pretrained(tmp_path)
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    bf16 = load_for_training(tmp_path, TrainConfig(bf16=True))
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    engine = TrainEngine(tiny_qwen3_from(tmp_path), TrainConfig(bf16=True))  # fp32, then cast
    cast = dict(engine.model.named_parameters())
    for name, p in bf16.named_parameters():
        assert torch.equal(p, cast[name]), name
    fp32 = load_for_training(tmp_path, TrainConfig(bf16=False))
    for name, p in fp32.named_parameters():
        assert p.dtype is torch.float32 and torch.equal(p, saved[name]), name


def tiny_qwen3_from(folder: Path) -> torch.nn.Module:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


# --- stepping ----------------------------------------------------------------------------------


@settings(max_examples=15)
@given(grad_accum=st.integers(1, 4), calls=st.integers(1, 9))
def test_optimizer_steps_only_at_accumulation_boundaries(grad_accum, calls):
    engine = TrainEngine(linear([1.0, 2.0]), TrainConfig(lr=0.1, grad_accum=grad_accum))
    flags = []
    for _ in range(calls):
        engine.backward(engine(torch.ones(1, 2)).sum())
        info = engine.step()
        flags.append(info["stepped"])
        assert (info["grad_norm"] is None) == (not info["stepped"])
    assert flags == [(i + 1) % grad_accum == 0 for i in range(calls)]
    assert engine.global_step == calls // grad_accum
    assert engine.pending_micro_batches == calls % grad_accum


def test_accumulation_follows_the_mean_micro_batch_loss():
    x1, x2 = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.5, 3.0]])
    accumulated = TrainEngine(linear([0.3, -0.7]), TrainConfig(lr=0.1, grad_accum=2))
    for x in (x1, x2):
        accumulated.backward((accumulated(x) ** 2).sum())
        accumulated.step()
    single = TrainEngine(linear([0.3, -0.7]), TrainConfig(lr=0.1, grad_accum=1))
    single.backward(((single(x1) ** 2).sum() + (single(x2) ** 2).sum()) / 2)
    single.step()
    assert torch.allclose(accumulated.model.weight, single.model.weight, atol=1e-7)
    assert not torch.equal(accumulated.model.weight, torch.tensor([[0.3, -0.7]]))


@pytest.mark.parametrize(("max_grad_norm", "used_grad"), [(1.0, [0.6, 0.8]), (0.0, [3.0, 4.0])])
def test_clipping_scales_the_gradient_to_max_norm(max_grad_norm, used_grad):
    # loss = w . (3, 4): gradient (3, 4), norm 5; AdamW's first moment after one step is
    # (1 - beta1) * g and the second (1 - beta2) * g^2 of the gradient it was given.
    config = TrainConfig(lr=0.1, max_grad_norm=max_grad_norm, betas=(0.9, 0.999))
    engine = TrainEngine(linear([0.0, 0.0]), config)
    engine.backward(engine(torch.tensor([[3.0, 4.0]])).sum())
    info = engine.step()
    assert info["grad_norm"] == pytest.approx(5.0)
    state = engine.optimizer.state[engine.model.weight]
    g = torch.tensor([used_grad])
    assert torch.allclose(state["exp_avg"], 0.1 * g)
    assert torch.allclose(state["exp_avg_sq"], 0.001 * g**2)


@pytest.mark.parametrize(
    ("scheduler", "warmup", "total", "lrs"),
    [
        ("constant", 0, 4, [1.0, 1.0, 1.0, 1.0]),
        ("constant", 2, 4, [0.0, 0.5, 1.0, 1.0]),
        ("linear", 2, 4, [0.0, 0.5, 1.0, 0.5]),
        ("linear", 0, 4, [1.0, 0.75, 0.5, 0.25]),
        ("cosine", 1, 3, [0.0, 1.0, 0.5]),
    ],
)
def test_lr_schedule(scheduler, warmup, total, lrs):
    config = TrainConfig(
        lr=1.0, scheduler=scheduler, warmup_steps=warmup, total_steps=total, grad_accum=2
    )
    engine = TrainEngine(linear([1.0]), config)
    seen = []
    for _ in range(total * 2):
        engine.backward(engine(torch.ones(1, 1)).sum())
        seen.append(engine.step()["lr"])
    assert seen == pytest.approx([lr for lr in lrs for _ in range(2)])


def test_bf16_steps_fp32_master_weights():
    # Each AdamW step moves w by lr = 1e-3 (constant gradient); bf16 around 1.0 has spacing
    # 2^-8 below 1, so pure bf16 steps would round back to 1.0 every time.
    engine = TrainEngine(linear([1.0]), TrainConfig(lr=1e-3, bf16=True, max_grad_norm=0))
    for _ in range(10):
        engine.backward(engine(torch.ones(1, 1, dtype=torch.bfloat16)).sum())
        engine.step()
    weight = engine.model.weight
    assert weight.dtype == torch.bfloat16
    assert weight.item() == torch.tensor(1 - 10 * 1e-3).bfloat16().item() != 1.0


def test_forward_with_gradients_outside_the_engine_is_refused():
    engine = TrainEngine(tiny_qwen3(), TrainConfig())
    batch = ids(0)
    with pytest.raises(RuntimeError, match=r"engine\(\.\.\.\), not engine.model"):
        engine.model(input_ids=batch)
    with torch.no_grad():
        inference = engine.model(input_ids=batch).logits
    assert torch.equal(inference, engine(input_ids=batch).logits.detach())


def test_gradient_checkpointing_gives_the_same_step():
    results = []
    for checkpointing in (False, True):
        engine = TrainEngine(
            tiny_qwen3(), TrainConfig(lr=1e-2, gradient_checkpointing=checkpointing)
        )
        engine.model.train()
        lm_step(engine, seed=3)
        results.append(export_hf_state_dict(engine))
        assert engine.model.is_gradient_checkpointing == checkpointing
    assert all(torch.allclose(results[0][k], results[1][k], atol=1e-6) for k in results[0])


# --- LoRA ----------------------------------------------------------------------------------------


def lora_weights(model: torch.nn.Module, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{adapter}." in n}


def base_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_each_adapter_trains_only_itself_and_the_base_stays_frozen():
    engine = TrainEngine(lora_model(), TrainConfig(lr=1e-2, weight_decay=0.1))
    base = base_weights(engine.model)
    for active, idle in (("policy", "rubric"), ("rubric", "policy")):
        before_active = lora_weights(engine.model, active)
        before_idle = lora_weights(engine.model, idle)
        engine.set_adapter(active)
        for seed in range(2):
            lm_step(engine, seed)
        after_active = lora_weights(engine.model, active)
        assert len(after_active) == 4  # lora_A and lora_B on q_proj and v_proj
        assert all(not torch.equal(after_active[n], before_active[n]) for n in after_active)
        assert all(
            torch.equal(p, before_idle[n]) for n, p in lora_weights(engine.model, idle).items()
        )
    assert all(torch.equal(p, base[n]) for n, p in base_weights(engine.model).items())
    assert all(p.requires_grad == ("lora_" in n) for n, p in engine.model.named_parameters())


def test_set_adapter_errors_name_the_problem():
    engine = TrainEngine(lora_model(), TrainConfig())
    with pytest.raises(ValueError, match=r"no adapter 'critic'; have \['policy', 'rubric'\]"):
        engine.set_adapter("critic")
    with pytest.raises(ValueError, match="no LoRA adapters"):
        TrainEngine(tiny_qwen3(), TrainConfig()).set_adapter("policy")


@pytest.mark.parametrize(
    ("adapters", "message"),
    [
        ({}, "empty"),
        ({"policy": {"rank": 4}}, "'policy': bad config.*rank"),
        ({"policy": {"r": 4, "use_dora": True}}, r"'policy': \['use_dora'\] not supported"),
    ],
)
def test_build_lora_model_rejects_bad_adapters(adapters, message):
    with pytest.raises(ValueError, match=message):
        build_lora_model(tiny_qwen3(), adapters)


# --- reference model ---------------------------------------------------------------------------


def test_reference_is_the_frozen_initial_full_model():
    initial = copy.deepcopy(tiny_qwen3())
    engine = TrainEngine(tiny_qwen3(), TrainConfig(lr=1e-2), reference=True)
    for seed in range(2):
        lm_step(engine, seed)
    batch = ids(7)
    ref_logits = engine.reference.logits(batch)
    assert not ref_logits.requires_grad
    assert torch.equal(ref_logits, initial(input_ids=batch).logits.detach())
    with torch.no_grad():
        assert not torch.allclose(ref_logits, engine.model(input_ids=batch).logits, atol=1e-4)


def test_lora_reference_is_the_base_with_adapters_disabled():
    base = tiny_qwen3().eval()
    engine = TrainEngine(lora_model(), TrainConfig(lr=1e-2), reference=True)
    lm_step(engine, 0)
    batch = ids(7)
    expected = base(input_ids=batch).logits.detach()
    assert torch.allclose(engine.reference.logits(batch), expected, atol=1e-6)
    assert engine.model.training  # restored after the reference's eval-mode forward
    assert not torch.allclose(engine(input_ids=batch).logits, expected, atol=1e-4)


def test_reference_refuses_a_zero3_partitioned_model():
    model = tiny_qwen3()
    model.lm_head.weight.ds_id = 0  # what ZeRO-3 attaches to partitioned parameters
    with pytest.raises(ValueError, match="partitioned by ZeRO-3"):
        ReferenceModel(model)


# --- export ------------------------------------------------------------------------------------


def test_full_model_export_is_its_state_dict_with_hf_names():
    model = tiny_qwen3()
    exported = export_hf_state_dict(model)
    expected = dict(model.named_parameters())
    assert list(exported) == list(expected)
    assert all(torch.equal(exported[n], p) for n, p in expected.items())
    exported["lm_head.weight"].zero_()  # a copy, not the live weight
    assert expected["lm_head.weight"].abs().sum() > 0


@pytest.mark.parametrize("adapter", ["policy", "rubric"])
def test_merged_lora_export_loads_into_the_plain_model_and_matches_the_adapter(adapter):
    engine = TrainEngine(lora_model(), TrainConfig(lr=1e-2))
    lm_step(engine, 0)
    names = [n for n, _ in iter_named_weights(engine, adapter=adapter)]
    assert not [n for n in names if "lora_" in n or "base_layer" in n or "base_model" in n]
    plain = tiny_qwen3()
    plain.load_state_dict(export_hf_state_dict(engine, adapter=adapter), strict=True)
    engine.set_adapter(adapter)
    engine.model.eval()
    batch = ids(5)
    with torch.no_grad():
        merged, adapted = plain(input_ids=batch).logits, engine.model(input_ids=batch).logits
    assert torch.allclose(merged, adapted, atol=1e-5)
    assert not torch.allclose(merged, tiny_qwen3()(input_ids=batch).logits, atol=1e-4)


def test_unmerged_lora_export_is_the_base():
    base = tiny_qwen3().state_dict()
    exported = export_hf_state_dict(lora_model(), merge_lora=False)
    assert list(exported) == list(base)
    assert all(torch.equal(exported[n], base[n]) for n in base)


def test_export_of_unknown_adapter_is_an_error():
    with pytest.raises(ValueError, match="no adapter 'critic'"):
        export_hf_state_dict(lora_model(), adapter="critic")


# --- two DeepSpeed ranks -----------------------------------------------------------------------


def replay_single_process(
    batches: list, lora: bool, clip_sets: bool = False
) -> tuple[TrainEngine, list[dict]]:
    """The plain path on all ranks' micro-batches: grad_accum = ranks x micro-batches per rank."""
    engine = ds_two_ranks.build_engine(lora, 2, clip_sets, grad_accum=len(batches[0]))
    infos = []
    for step_batches in batches:
        for batch in step_batches:
            engine.backward(ds_two_ranks.micro_loss(engine, batch, lora))
            infos.append(engine.step())
    return engine, [info for info in infos if info["stepped"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("zero_stage", "lora", "clip_sets", "load"),
    [(2, False, False, False), (3, True, False, False), (2, True, True, False),
     (3, False, False, True)],
)  # fmt: skip
def test_two_deepspeed_ranks_match_the_single_process_path(
    tmp_path, zero_stage, lora, clip_sets, load, launch_two_ranks
):
    """Clip sets: ARCO's parameter groups, π's and μ's adapters clipped apart, under ZeRO-2.
    Load: the full model saved and loaded by ``load_for_training``, partitioned by ZeRO-3 as it
    loads (each rank checks its share), then trained as the in-memory model is."""
    args = [str(SCRIPT), "--zero-stage", str(zero_stage), "--out", str(tmp_path)]
    args += (["--lora"] if lora else []) + (["--clip-sets"] if clip_sets else [])
    if load:
        tiny_qwen3().save_pretrained(tmp_path / "model")
        args += ["--load", str(tmp_path / "model")]
    run = launch_two_ranks(args, one_thread=False)
    output = run.stdout[-20000:] + run.stderr[-20000:]
    assert run.returncode == 0, output
    assert "rank 0: ok" in output and "rank 1: ok" in output, output

    result = torch.load(tmp_path / "result.pt", weights_only=False)
    engine, infos = replay_single_process(result["batches"], lora, clip_sets)
    ds_infos = [info for info in result["infos"] if info["stepped"]]
    if clip_sets:  # each adapter's own norm, and at least one step clipped by it
        for key in ("grad_norm/policy", "grad_norm/rubric"):
            assert [i[key] for i in ds_infos] == pytest.approx([i[key] for i in infos], rel=1e-5)
        assert max(i["grad_norm/policy"] for i in ds_infos) > ds_two_ranks.CLIP_SETS_NORM
    assert [i["lr"] for i in ds_infos] == pytest.approx([0.0, 1e-2, 1e-2 * 8 / 9])
    assert [i["lr"] for i in ds_infos] == pytest.approx([i["lr"] for i in infos])
    assert [i["grad_norm"] for i in ds_infos] == pytest.approx([i["grad_norm"] for i in infos])
    for adapter, ds_state in result["states"].items():
        state = export_hf_state_dict(engine, adapter=adapter)
        assert list(state) == list(ds_state)
        assert all(torch.allclose(state[n], ds_state[n], atol=1e-6) for n in state), adapter

    checkpoint = tmp_path / "run" / "checkpoints" / f"step_{ds_two_ranks.STEPS}"
    saved = transformers.Qwen3ForCausalLM.from_pretrained(checkpoint).state_dict()
    expected = result["states"]["policy" if lora else None]
    assert all(torch.equal(saved[n], expected[n]) for n in expected)
    assert math.isfinite(ds_infos[-1]["grad_norm"])


# --- DeepSpeed with bf16 weights, one rank per stage ----------------------------------------------


@pytest.mark.slow
def test_bf16_deepspeed_runs_fp32_accumulating_zero_2_and_3_and_refuses_stages_0_and_1(
    tmp_path, free_port
):
    """A real DeepSpeed engine on one CPU rank over the tiny Qwen3 in bf16, per ZeRO stage.
    DeepSpeed 0.19.8 with bf16 and ``grad_accum_dtype`` fp32 raised NotImplementedError at stage
    0 and built its BF16_Optimizer at stage 1; the engine refuses both in one line. Stages 2 and
    3 are ZeRO's own optimizers summing gradients in fp32, and a NaN loss's step is skipped (the
    weights and the schedule kept) by the overflow check the config names, not by a default."""
    out = tmp_path / "stages.json"
    env = os.environ | {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()), "CUDA_VISIBLE_DEVICES": "",
    }  # fmt: skip
    script = Path(__file__).parent / "scripts" / "ds_bf16_stages.py"
    run = subprocess.run(
        [sys.executable, str(script), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    stages = json.loads(out.read_text())
    for stage in ("0", "1"):
        error = stages[stage]["error"]
        assert error.startswith("ValueError: ") and "\n" not in error, error
        assert f"train.zero_stage={stage}" in error and "train.bf16" in error, error
    expected = {"2": "DeepSpeedZeroOptimizer", "3": "DeepSpeedZeroOptimizer_Stage3"}
    for stage, optimizer in expected.items():
        report = stages[stage]
        assert report["optimizer"] == optimizer, report
        assert report["grad_accum_dtype"] == "torch.float32", report
        assert report["nan_step"] == {"skipped": True, "weights_kept": True, "lr_kept": True}
    assert stages["2"]["check_grad_overflow"] is True


def test_bf16_deepspeed_config_names_fp32_accumulation_and_the_overflow_check():
    """The settings that make stages 2 and 3 correct are in the config, not DeepSpeed's
    defaults; an fp32 model's config sets neither (its accumulation is fp32 already)."""
    for stage in (2, 3):
        cfg = deepspeed_config(TrainConfig(zero_stage=stage), bf16=True)
        assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}
        assert cfg["bf16"] == {"enabled": True, "check_grad_overflow": True}
        assert cfg["zero_optimization"] == {"stage": stage}
    for stage in range(4):
        cfg = deepspeed_config(TrainConfig(zero_stage=stage), bf16=False)
        assert cfg["bf16"] == {"enabled": False} and "data_types" not in cfg
    for stage in (0, 1):
        with pytest.raises(ValueError, match=rf"train\.zero_stage={stage} .*train\.bf16"):
            deepspeed_config(TrainConfig(zero_stage=stage), bf16=True)


def test_deepspeed_is_the_pinned_version():
    """The engine's fp32 accumulation and non-finite skip were read off DeepSpeed 0.19.8's code
    (0.19.6 differs): pyproject pins it, and that is the one installed."""
    import deepspeed

    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"deepspeed==0.19.8"' in pyproject
    assert deepspeed.__version__ == "0.19.8"


# --- clip sets and fp32 weights under bf16 -----------------------------------------------------


def two_weights() -> torch.nn.Module:
    model = torch.nn.Module()
    model.a = linear([0.0, 0.0])
    model.b = linear([0.0])
    return model


@pytest.mark.parametrize(
    ("clip", "used_a", "used_b"),
    [
        # loss = a . (30, 40) + b . (0.3): a's gradient has norm 50, b's 0.3
        ({"a": "pi", "b": "mu"}, [0.6, 0.8], [0.3]),  # each set on its own: b untouched
        (None, [30 / 50.0003, 40 / 50.0003], [0.3 / 50.0009]),  # one clip: b shrunk 166x
    ],
)
def test_clip_sets_are_clipped_apart(clip, used_a, used_b):
    model = two_weights()
    groups = [
        {"name": n, "params": [getattr(model, n).weight], "lr": 0.1}
        | ({"clip": clip[n]} if clip else {})
        for n in ("a", "b")
    ]
    engine = TrainEngine(model, TrainConfig(lr=0.1, max_grad_norm=1.0), param_groups=groups)
    loss = model.a(torch.tensor([[30.0, 40.0]])).sum() + model.b(torch.tensor([[0.3]])).sum()
    engine.backward(loss)
    info = engine.step()
    assert info["grad_norm"] == pytest.approx(math.hypot(50, 0.3))
    if clip:
        assert info["grad_norm/pi"] == pytest.approx(50.0)
        assert info["grad_norm/mu"] == pytest.approx(0.3)
    for name, used in (("a", used_a), ("b", used_b)):
        state = engine.optimizer.state[getattr(model, name).weight]
        assert torch.allclose(state["exp_avg"], 0.1 * torch.tensor([used]), rtol=1e-4)


def test_clip_sets_must_cover_every_group():
    model = two_weights()
    groups = [
        {"name": "a", "params": [model.a.weight], "clip": "pi"},
        {"name": "b", "params": [model.b.weight]},
    ]
    with pytest.raises(ValueError, match="clip set in every parameter group or in none"):
        TrainEngine(model, TrainConfig(), param_groups=groups)


class HalfFrozen(torch.nn.Module):
    """A frozen base layer and a trained adapter the model keeps in fp32 under bf16."""

    def __init__(self):
        super().__init__()
        self.base = linear([1.0])
        self.base.weight.requires_grad_(False)
        self.adapter = linear([1.0])

    @staticmethod
    def fp32_parameter(name: str) -> bool:
        return name.startswith("adapter.")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.adapter(x.float())


def test_bf16_keeps_the_weights_a_model_names_in_fp32_and_steps_them_directly():
    model = HalfFrozen()
    engine = TrainEngine(model, TrainConfig(lr=1e-3, bf16=True, max_grad_norm=0))
    assert model.base.weight.dtype == torch.bfloat16
    assert model.adapter.weight.dtype == torch.float32
    assert engine._backend.masters is None  # the trained weights are fp32 themselves
    for _ in range(10):
        engine.backward(engine(torch.ones(1, 1, dtype=torch.bfloat16)).float().sum())
        engine.step()
    # fp32 steps of lr each: 1 - 10e-3, which bf16 (spacing 2^-8 below 1) could not hold
    assert model.adapter.weight.item() == pytest.approx(1 - 10 * 1e-3, abs=1e-6)


def test_mixed_trained_dtypes_are_refused():
    model = HalfFrozen()
    model.base.weight.requires_grad_(True)  # a trained weight the model leaves to bf16
    with pytest.raises(ValueError, match="one dtype only"):
        TrainEngine(model, TrainConfig(bf16=True))
