"""The memory plan (common.train.memory_plan): its formulas against hand-computed bytes, the
activation measurement at a small width, and a plan for every paper config without a model."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from common.train import memory_plan as mp
from experiments.rehearse.runner import PAPER_CONFIGS, ROOT, Report

GB = 10**9
SMALL = mp.ModelArch("small", "qwen3", 128, 4, 4, 2, 32, 384, 1000, True, qk_norm=True)


def formula_cost(arch: mp.ModelArch, lora: mp.LoraShape | None) -> mp.ActivationCost:
    """A stand-in for the measurement: 53 x hidden bytes a token and layer (what a Qwen3 layer
    saves, measured), so the paper-config tests build no layer at the real width."""
    h = arch.hidden_size
    return mp.ActivationCost((0.0, 53.0 * h, 0.0), (0.0, 20.0 * h, 0.0), h, 2)


@pytest.fixture
def offline_table(monkeypatch, tmp_path):
    """No hub cache, no network, and no model may load: the plan reads the built-in table."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("the memory plan loaded a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def test_zero_2_on_8_ranks_of_a_1b_model_by_hand():
    p, ranks = 10**9, 8
    # bf16 weights, whole on every rank below ZeRO-3: 2 bytes x 1e9 = 2 GB
    assert mp.weight_bytes(p, 2, ranks) == 2 * GB
    # fp32-accumulated gradients, sharded at ZeRO-2: 4 bytes x 1e9 / 8 = 0.5 GB
    assert mp.gradient_bytes(p, 2, ranks, 4) == 0.5 * GB
    # fp32 master + Adam m, v = 12 bytes x 1e9 / 8 = 1.5 GB
    assert mp.optimizer_bytes(p, 2, ranks, master=True) == 1.5 * GB
    # ZeRO-3 shards the weights too: 2 GB / 8; ZeRO-1 leaves the gradients whole: 4 GB
    assert mp.weight_bytes(p, 3, ranks) == 0.25 * GB
    assert mp.gradient_bytes(p, 1, ranks, 4) == 4 * GB
    # stage 0: nothing sharded; LoRA (fp32 weights, no master): 8 bytes a trained parameter
    assert mp.optimizer_bytes(p, 0, ranks, master=True) == 12 * GB
    assert mp.optimizer_bytes(10**6, 1, ranks, master=False) == 10**6
    # DeepSpeed's default reduce bucket, 5e8 bf16 elements = 1 GB (stage 2); stage 3 also keeps
    # up to 1e9 gathered bf16 parameters (2 GB); stage 1 neither
    assert mp.zero_buffer_bytes(p, 2, 2) == 1 * GB
    assert mp.zero_buffer_bytes(8 * p, 3, 2) == 3 * GB and mp.zero_buffer_bytes(p, 1, 2) == 0


def test_zero_stages_never_hold_more_and_one_rank_is_stage_0():
    p = 4 * 10**9
    totals = [
        mp.weight_bytes(p, s, 8) + mp.gradient_bytes(p, s, 8, 4) + mp.optimizer_bytes(p, s, 8, True)
        for s in range(4)
    ]
    assert totals == sorted(totals, reverse=True) and totals[3] < totals[0] / 7
    assert mp.effective_stage(3, 1) == 0 and mp.effective_stage(3, 8) == 3


def test_parameters_and_kv_bytes_from_the_published_architectures():
    # Qwen3-0.6B's published parameter count (tied embeddings, q/k norms)
    assert mp.PAPER_MODELS["Qwen/Qwen3-0.6B"].params() == 596_049_920
    # K and V of 36 layers x 8 KV heads x 128 dims in bf16: 2 x 36 x 8 x 128 x 2 = 147,456
    assert mp.PAPER_MODELS["Qwen/Qwen3-4B"].kv_bytes_per_token() == 147_456
    eight = mp.PAPER_MODELS["Qwen/Qwen3-8B-Base"]
    assert not eight.tied_embeddings and 8.1e9 < eight.params() < 8.3e9
    # LoRA r=8 on q (2560 -> 4096) and v (2560 -> 1024) over 36 layers
    lora = mp.LoraShape(8, ("q_proj", "v_proj"))
    assert lora.adapter_params(mp.PAPER_MODELS["Qwen/Qwen3-4B"]) == 36 * 8 * (6656 + 3584)
    with pytest.raises(mp.MemoryPlanError, match="lora.target_modules"):
        mp.LoraShape(8, ("qkv",)).adapter_params(SMALL)


def test_a_local_config_json_is_read_and_a_bad_one_names_the_file(tmp_path):
    fields = {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(fields))
    arch = mp.model_arch(str(tmp_path))
    assert arch.params() == 596_049_920 and arch.source.endswith("config.json")
    del fields["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(mp.MemoryPlanError, match=r"config\.json: no 'intermediate_size'"):
        mp.model_arch(str(tmp_path))


def test_an_unknown_model_is_one_error_naming_the_key(offline_table):
    with pytest.raises(mp.MemoryPlanError, match="assets.model: 'nobody/nothing'"):
        mp.model_arch("nobody/nothing")


def test_the_measured_cost_is_positive_linear_in_tokens_and_saves_no_t_squared():
    cost = mp.measure_activation_cost(SMALL)
    h = SMALL.hidden_size
    assert cost.layer[2] == 0  # SDPA's flash path: no T x T attention weights saved
    one, two = cost.layer_bytes(256), cost.layer_bytes(512)
    assert one > 0 and two == pytest.approx(2 * one, rel=0.02)
    # norms, q/k norms, rotary, attention, SwiGLU: tens of bytes a hidden unit (about 53 here)
    assert 30 * h < cost.per_token(512) < 80 * h
    # a frozen base keeps no inputs of its linear layers for weight gradients
    lora = mp.measure_activation_cost(SMALL, mp.LoraShape(4, ("q_proj", "v_proj"), 0.05))
    assert 0 < lora.per_token(512) < cost.per_token(512)
    assert mp.measure_activation_cost(SMALL) is cost  # cached per width


def test_checkpointing_keeps_less_than_every_layer():
    cost = mp.measure_activation_cost(SMALL)
    on = mp.activation_bytes(cost, 28, 2, 4096, checkpointing=True)
    off = mp.activation_bytes(cost, 28, 2, 4096, checkpointing=False)
    # with checkpointing a layer keeps its bf16 input (hidden x 2 bytes a token) and no more
    assert 28 * 2 * 4096 * 128 * 2 < on < off / 3


@pytest.mark.parametrize("config", PAPER_CONFIGS)
def test_every_paper_config_gets_a_plan_without_a_model(config, offline_table):
    plan = mp.plan_for_config(ROOT / config, 8, measure=formula_cost)
    text = plan.format()
    assert [g.label for g in plan.gpus] == ["80 GB", "141 GB"]
    assert "| GiB per rank | 80 GB | 141 GB |" in text
    assert text.count("\n- 80 GB: ") == 1 and text.count("\n- 141 GB: ") == 1
    for g in plan.gpus:
        assert 0 < g.kv_bytes < g.vllm_share < g.rollout_peak < g.capacity
    assert plan.fits == all(plan.fits_on().values())


def test_an_oversized_config_says_it_does_not_fit(offline_table):
    config = ROOT / "eviback/configs/qwen3_4b.yaml"
    big = ["loss.micro_batch_size=64", "train.gradient_checkpointing=false"]
    plan = mp.plan_for_config(config, 8, overrides=big, measure=formula_cost)
    assert not plan.fits and not any(plan.fits_on().values())
    text = plan.format()
    assert "80 GB: does not fit: needs" in text and "lower loss.micro_batch_size" in text
    assert "set train.gradient_checkpointing=true" in text
    starved = mp.plan_for_config(
        config, 8, 80, ["engine.gpu_memory_utilization=0.1"], measure=formula_cost
    )
    assert not starved.fits and "raise engine.gpu_memory_utilization" in starved.format()


def test_one_rank_trains_without_deepspeed_with_fp32_gradients(offline_table):
    plan = mp.plan_for_config(
        ROOT / "cer/configs/qwen3_4b_base_math.yaml", 1, 141, measure=formula_cost
    )
    p = plan.arch.params()
    assert plan.shape.zero_stage == 0 and plan.rows["gradients (fp32)"] == 4 * p
    assert plan.rows["weights (bf16)"] == 2 * p


def test_the_cli_prints_the_plan_and_refuses_a_bad_config(offline_table, monkeypatch, capsys):
    monkeypatch.setattr(mp, "measure_activation_cost", formula_cost)
    code = mp.main(["--config", str(ROOT / "cer/configs/qwen3_8b_base_math.yaml")])
    assert code == 0 and "ZeRO-3" in capsys.readouterr().out
    args = ["--config", str(ROOT / "eviback/configs/qwen3_4b.yaml"), "--gpu-gib", "40"]
    assert mp.main([*args, "loss.micro_batch_size=64", "train.gradient_checkpointing=false"]) == 1
    assert "- 40 GiB: does not fit" in capsys.readouterr().out
    assert mp.main(["--config", str(ROOT / "README.md")]) == 2
    assert "not under arco/" in capsys.readouterr().err


def test_the_rehearsal_report_carries_the_plan():
    report = Report("cer/configs/x.yaml", None, 1, "cpu", memory_plan="| GiB per rank |")
    assert "## GPU memory plan of the paper run (8 ranks)" in report.markdown()
    assert "## GPU memory plan" not in Report("a.yaml", None, 1, "cpu").markdown()


def test_a_trainer_announces_the_plan_only_on_a_gpu(offline_table, monkeypatch, capsys):
    from types import SimpleNamespace

    from common.config import load_config

    cfg = load_config(
        mp.config_class("cer/configs/qwen3_8b_base_math.yaml"),
        ROOT / "cer/configs/qwen3_8b_base_math.yaml",
    )
    assert mp.announce_plan(cfg) is None and capsys.readouterr().out == ""  # a CPU: nothing
    # a 16 GiB GPU, as torch reports it, on rank 0 of 8: the plan, then the warning
    monkeypatch.setattr(mp, "measure_activation_cost", formula_cost)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    gpu = SimpleNamespace(total_memory=16 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: gpu)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    plan = mp.announce_plan(cfg)
    out = capsys.readouterr().out
    assert plan is not None and not plan.fits_on()["this GPU"]
    assert "this GPU" in out and out.strip().splitlines()[-1] == (
        "[memory plan] WARNING: at its longest lengths this run does not fit on this GPU "
        "(16 GiB, 8 rank(s)); see the plan above"
    )
    monkeypatch.setenv("RANK", "3")  # only rank 0 speaks
    assert mp.announce_plan(cfg) is None and capsys.readouterr().out == ""
