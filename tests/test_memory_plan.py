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


def formula_cost(
    arch: mp.ModelArch, lora: mp.LoraShape | None, mask: str = "none"
) -> mp.ActivationCost:
    """A stand-in for the measurement: 53 x hidden bytes a token and layer (what a Qwen3 layer
    saves, measured), so the paper-config tests build no layer at the real width; a masked
    batch's bf16 mask, 2 bytes/T^2, in every layer (padding) or once (additive)."""
    h = arch.hidden_size
    layer = (0.0, 53.0 * h, 2.0 if mask == "padding" else 0.0)
    outside = (0.0, 20.0 * h, 2.0 if mask == "additive" else 0.0)
    return mp.ActivationCost(layer, outside, h, 2, mask=mask)


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


# --- padded rows, ARCO's μ rows, vLLM's batch settings, update_terms ------------------------

ARCO_4B = ROOT / "arco/configs/qwen3_4b_hotpotqa.yaml"


def _arco(*overrides: str):
    from common.config import load_config

    return load_config(mp.config_class(ARCO_4B), ARCO_4B, list(overrides))


def test_a_padded_row_saves_k_and_v_at_the_query_heads_and_a_mask_per_layer():
    none = mp.measure_activation_cost(SMALL)
    padded = mp.measure_activation_cost(SMALL, mask="padding")
    additive = mp.measure_activation_cost(SMALL, mask="additive")
    # repeat_kv: K and V at 4 heads, not 2: 2 tensors x 2 more heads x 32 dims x 2 bytes = 256
    # bytes a token more; SDPA's bf16 copy of the mask, [1, 1, T, T], in every layer: 2 x T^2
    assert padded.layer == (0.0, none.layer[1] + 256, 2.0)
    assert padded.outside == none.outside
    # ARCO's additive mask: K and V repeated alike, the mask saved once (outside the layers)
    assert additive.layer == (0.0, none.layer[1] + 256, 0.0)
    assert additive.outside == (0.0, none.outside[1], 2.0)
    rows, t, layers = 3, 1000, 28
    off = mp.activation_bytes(padded, layers, rows, t, checkpointing=False)
    assert off - mp.activation_bytes(none, layers, rows, t, False) == rows * layers * (
        256 * t + 2 * t * t
    )
    # checkpointed: one layer recomputed (its mask copy with it) and HF's boolean mask held
    on = mp.activation_bytes(padded, layers, rows, t, checkpointing=True)
    assert (
        on - mp.activation_bytes(none, layers, rows, t, True)
        == rows * (256 * t + 2 * t * t) + rows * t * t
    )
    assert mp.activation_bytes(additive, layers, rows, t, False) - mp.activation_bytes(
        none, layers, rows, t, False
    ) == rows * (layers * 256 * t + 2 * t * t)


def test_mu_rows_of_the_paper_arco_config_by_hand():
    cfg = _arco()
    system = -(-len(cfg.rubric.system.format(task=cfg.rubric.task)) // 3)
    example = json.dumps({"criteria": ["...", "...", "..."]})
    request = -(-len(cfg.rubric.request.format(k=3, example=example)) // 3)
    # 4 steps (3 searches and the answer); the longest row: 4,096 tokens of trajectory, μ's
    # system text and request, 128 criteria tokens, 48 of labels; each other row's tail: its
    # action (64), criteria (128), the request and the labels
    row = 4096 + system + request + 128 + 48
    mu = mp.mu_rows(cfg, 4)
    assert mu == mp.MuRows(
        rows=4,  # rl.micro_batch_size trajectories, one packed row each
        tokens=row + 3 * (64 + 128 + 48 + request),
        mask="additive",
        logit_rows=4 * 4 * 128,  # μ's KL at every criteria token
        beside_pi=False,
        row_tokens=row,
        steps=4,
    )
    assert mp.run_shape(cfg, 8).mu == mu and mp.run_shape(cfg, 8).padded
    per_row = mp.mu_rows(_arco("rubric.shared_prefix=false"), 4)
    assert (per_row.rows, per_row.tokens, per_row.mask) == (16, row, "padding")
    assert mp.mu_rows(_arco("rl.mu_single_forward=false"), 4).beside_pi
    assert mp.mu_rows(_arco("rl.mu_kl_coef=0"), 4).logit_rows == 0
    none = mp.mu_rows(_arco("rubric.mode=none"), 4)
    assert none.row_tokens == 4096 + system + 48 and none.logit_rows == 0
    assert mp.mu_rows(_arco("rl.freeze_rubric=true"), 4) is None
    assert mp.mu_rows(_arco("method=prm"), 4) is None


def test_mu_rows_enter_the_update_phase(offline_table):
    arch = mp.PAPER_MODELS["Qwen/Qwen3-4B-Instruct-2507"]
    h, layers = arch.hidden_size, arch.num_layers
    plans = {
        name: mp.plan_for_run(_arco(*over), 8, 80, measure=formula_cost)
        for name, over in {
            "single": [],
            "joint": ["rl.mu_single_forward=false"],
            "frozen": ["rl.freeze_rubric=true"],
        }.items()
    }
    single = plans["single"]
    mu = single.shape.mu
    # checkpointed: each layer's bf16 input, one layer (53 h a token) and the rest (20 h a token
    # and the additive mask once, 2 bytes an entry), a trunk a row
    t = mu.tokens
    by_hand = mu.rows * (layers * t * h * 2 + 53 * h * t + 20 * h * t + 2 * t * t)
    assert single.mu_activations[True] == by_hand
    assert single.mu_activations[False] == mu.rows * (layers * 53 * h * t + 20 * h * t + 2 * t * t)
    # π: 4 padded rows of 4,096 (the mask in each layer, HF's boolean one held once)
    t = 4096
    pi_on = 4 * (layers * t * h * 2 + 53 * h * t + 2 * t * t + 20 * h * t) + 4 * t * t
    assert single.activations[True] == pi_on
    mu_phase = by_hand + 4 * 4 * 128 * arch.vocab_size * 12
    pi_phase = pi_on + 4 * 256 * arch.vocab_size * 12  # π's logits: 4 x 4 turns of 64
    assert mu_phase > pi_phase
    frozen, joint = plans["frozen"].gpus[0].update_peak, plans["joint"].gpus[0].update_peak
    # μ frozen: π's phase alone; μ's update first (single forward): the larger phase; one
    # backward over both: both
    assert plans["frozen"].shape.mu is None and not plans["frozen"].mu_activations
    assert single.gpus[0].update_peak - frozen == pytest.approx(mu_phase - pi_phase, abs=1)
    assert joint - frozen == pytest.approx(mu_phase, abs=1)
    text = single.format()
    assert f"| μ's 4 x {mu.tokens:,}-token rows, checkpointing on (in use) |" in text
    assert "μ logits (2,048 criteria positions x 151,936)" in text
    assert "rl.mu_single_forward=true" in text


def test_vllm_takes_the_configs_batch_settings(offline_table):
    config = ROOT / "cer/configs/qwen3_8b_base_math.yaml"  # max_num_seqs 512, 16,384 tokens
    default = mp.plan_for_config(config, 8, 80, measure=formula_cost)
    assert (default.shape.vllm_batched_tokens, default.shape.vllm_max_seqs) == (16384, 512)
    fewer = mp.plan_for_config(
        config, 8, 80, ["engine.max_num_batched_tokens=4096"], measure=formula_cost
    )
    # Qwen3-8B: gate + up (2 x 12,288), q, k, v ((32 + 2 x 8) x 128) and hidden (4,096) bf16
    # entries a token of the profiling forward: 34,816 x 2 bytes, for 12,288 tokens fewer
    freed = (16384 - 4096) * (2 * 12288 + 48 * 128 + 4096) * 2
    assert fewer.gpus[0].kv_bytes - default.gpus[0].kv_bytes == freed
    assert "profiling activations (4,096 tokens, 512 sampler rows)" in fewer.format()
    unset = mp.plan_for_config(
        config,
        8,
        80,
        ["engine.max_num_batched_tokens=0", "engine.max_num_seqs=0"],
        measure=formula_cost,
    )
    assert (unset.shape.vllm_batched_tokens, unset.shape.vllm_max_seqs) == (16384, 1024)


def test_update_terms_of_a_tiny_model_by_hand():
    from common.run_config import LossConfig

    assert LossConfig().logprob_chunk == mp.LOGPROB_CHUNK
    # embeddings 1,000 x 128 (tied); a layer: q, o 128 x 128, k, v 128 x 64, gate, up, down
    # 128 x 384, two norms of 128 and q/k norms of 32; the final norm
    p = 1000 * 128 + 4 * (2 * 16384 + 2 * 8192 + 3 * 49152 + 2 * 128 + 2 * 32) + 128
    assert p == SMALL.params() == 915_840
    shape = {"rows": 2, "tokens": 64, "gradient_checkpointing": True, "padded": False}
    zero2 = mp.update_terms(SMALL, zero_stage=2, ranks=4, bf16=True, **shape)
    cost = mp.measure_activation_cost(SMALL)
    layer, outside = cost.layer[1] * 64, cost.outside[1] * 64  # linear in T, no padding
    assert zero2 == {
        "weights": 2 * p,  # bf16, whole below ZeRO-3
        "optimizer": 12 * p / 4,  # fp32 master, m, v sharded over 4 ranks
        "gradients": 4 * p / 4,  # fp32 (grad_accum_dtype), sharded at stage 2
        "zero_buffers": 5e8 * 2,  # DeepSpeed's reduce bucket, bf16
        # each of the 4 layers' bf16 input, one layer recomputed, the rest, for 2 rows
        "activations": 2 * (4 * 64 * 128 * 2 + layer + outside),
        "logits": 2 * 64 * 1000 * 12,  # 128 positions, under the 1,024 of a chunk
        "peak": pytest.approx(
            2 * p + 3 * p + p + 1e9 + 2 * (4 * 64 * 128 * 2 + layer + outside) + 128 * 12000
        ),
    }
    # one rank: the plain backend (stage 0 whatever zero_stage says), fp32 gradients
    one = mp.update_terms(SMALL, zero_stage=3, ranks=1, bf16=True, logprob_chunk=100, **shape)
    assert (one["weights"], one["optimizer"], one["gradients"]) == (2 * p, 12 * p, 4 * p)
    assert one["zero_buffers"] == 0 and one["logits"] == 100 * 1000 * 12
    # fp32: 4-byte weights, no master copy; ZeRO-3 shards the weights too
    fp32 = mp.update_terms(SMALL, zero_stage=3, ranks=4, bf16=False, **shape)
    assert (fp32["weights"], fp32["optimizer"], fp32["gradients"]) == (p, 2 * p, p)
    # padded, no checkpointing: every layer's tensors with K, V repeated and the mask per layer
    padded = mp.update_terms(
        SMALL, rows=2, tokens=64, zero_stage=2, ranks=4, gradient_checkpointing=False,
        bf16=True, padded=True,
    )  # fmt: skip
    plain = mp.update_terms(
        SMALL, rows=2, tokens=64, zero_stage=2, ranks=4, gradient_checkpointing=False,
        bf16=True, padded=False,
    )  # fmt: skip
    assert padded["activations"] - plain["activations"] == 2 * 4 * (256 * 64 + 2 * 64 * 64)
    assert padded["peak"] == sum(v for k, v in padded.items() if k != "peak")


@pytest.mark.parametrize("padded", [False, True])
def test_update_terms_activations_match_a_whole_models_saved_bytes(padded):
    """The plan's 2-layer, one-row measurement scaled to 4 layers and 3 rows of 96 tokens,
    against every tensor a 4-layer model saves over that batch (the second row padded)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = mp.torch_config(SMALL, SMALL.num_layers, SMALL.vocab_size)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    total: dict[int, int] = {}  # bytes by storage: each saved storage once

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            total[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, SMALL.vocab_size, (3, 96))
    mask = torch.ones_like(ids)
    if padded:
        mask[1, -7:] = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    planned = mp.update_terms(
        SMALL, rows=3, tokens=96, zero_stage=0, ranks=1, gradient_checkpointing=False,
        bf16=True, padded=padded,
    )["activations"]  # fmt: skip
    assert planned == pytest.approx(sum(total.values()), rel=0.01)
