"""ARCO with bf16 on, on this CPU (it has avx512_bf16), as every GPU run has it: the base in bf16,
the four adapters and the scoring head in fp32, through warmup, RL, checkpoints and diagnose."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_arco_run import overrides

from arco.config import ArcoConfig
from arco.rubric_model import HEAD_FILE, ArcoModel, build_arco_model
from common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"


def dtypes(model: ArcoModel) -> dict[str, set[torch.dtype]]:
    out: dict[str, set[torch.dtype]] = {"base": set(), "adapters": set(), "head": set()}
    for name, p in model.named_parameters():
        part = "head" if name.startswith("head.") else "adapters" if "lora_" in name else "base"
        out[part].add(p.dtype)
    return out


def test_a_bf16_base_keeps_adapters_and_head_in_fp32(tiny_world):
    model = build_arco_model(
        tiny_world / "model", {"r": 4, "lora_alpha": 8}, 3, dtype=torch.bfloat16
    )
    want = {"base": {torch.bfloat16}, "adapters": {torch.float32}, "head": {torch.float32}}
    assert dtypes(model) == want
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        logits, scores = model("rubric", ids, torch.ones_like(ids), pool_mask=torch.ones_like(ids))
    assert logits.dtype == torch.bfloat16 and scores.dtype == torch.float32


def test_reference_forwards_run_without_dropout(tiny_world):
    """With dropout on and the module in train mode, π_ref's logits are still deterministic and
    equal π's in eval mode (the references are copies of the adapters)."""
    model = build_arco_model(
        tiny_world / "model", {"r": 4, "lora_alpha": 8, "lora_dropout": 0.5}, 3
    )
    for name, p in model.named_parameters():  # B = 0 at init would hide the dropout
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5, generator=torch.Generator().manual_seed(0))
    model.sync_references()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    mask = torch.ones_like(ids)
    model.train()
    with torch.no_grad():
        ref = [model("policy_ref", ids, mask)[0] for _ in range(2)]
        assert model.training
        noisy = model("policy", ids, mask)[0]
        model.eval()
        clean = model("policy", ids, mask)[0]
    torch.testing.assert_close(ref[0], ref[1])
    torch.testing.assert_close(ref[0], clean)
    assert not torch.allclose(noisy, clean)  # the trained adapter does drop out in train mode


@pytest.mark.slow
def test_warmup_rl_checkpoint_and_diagnose_with_bf16(tiny_world, tmp_path):
    from arco.diagnose import run_diagnose
    from arco.trainer import train_arco
    from arco.warmup import run_warmup

    over = [
        *overrides(tiny_world, tmp_path, backend="hf"),
        "train.bf16=true",
        "diagnose.questions=2",
        "diagnose.samples=2",
    ]
    run_warmup(load_config(ArcoConfig, CONFIG, over))
    head = load_file(tmp_path / "warmup" / HEAD_FILE)
    assert {t.dtype for t in head.values()} == {torch.float32}
    out = train_arco(load_config(ArcoConfig, CONFIG, over))
    want = {"base": {torch.bfloat16}, "adapters": {torch.float32}, "head": {torch.float32}}
    assert dtypes(out["model"]) == want
    rotary = {b.dtype for n, b in out["model"].named_buffers() if n.endswith("inv_freq")}
    assert rotary == {torch.float32}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in rows if "reward" in r]
    assert [r["phase_dense"] for r in steps] == [0.0, 1.0]
    for r in steps:  # π and μ clipped apart, each with its own norm
        assert math.isfinite(r["loss_mu"]) and math.isfinite(r["grad_norm/policy"])
        assert r["grad_norm/rubric"] > 0.0
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert {t.dtype for t in load_file(ckpt / HEAD_FILE).values()} == {torch.float32}
    result = run_diagnose(load_config(ArcoConfig, CONFIG, over), str(ckpt))
    assert result["trajectories"] == 4
