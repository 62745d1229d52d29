"""μ's update forward (``rubric_update``, ``rl.mu_single_forward``) runs in training mode with
only its dropout off: HF checkpoints a layer only when the model is in training mode, so an
eval-mode forward would keep every layer's activations however ``train.gradient_checkpointing``
is set. Its scores stay the deterministic μ's (``score_items``), and so do its gradients, also
when a reference forward inside it switches the modules back to training mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from saved_tensors import saved_bytes
from test_arco_ablations import EPISODES, cfg_for

from arco.rubric_model import build_arco_model
from arco.rubric_prompt import format_criteria
from arco.rubrics import score_items
from arco.trainer import make_rubric_items, rubric_update
from common.rollout.agent import encode_text
from common.train import TrainEngine

LAYERS = 8


@pytest.fixture(scope="module")
def deep_model(tiny_world, tmp_path_factory) -> Path:
    """The tiny world's model at 8 layers (random weights) and its tokenizer: the layers'
    activations, which checkpointing drops, outweigh what lies outside them."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("deep") / "model"
    config = AutoConfig.from_pretrained(tiny_world / "model")
    config.num_hidden_layers = LAYERS
    config.layer_types = [config.layer_types[0]] * LAYERS
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_world / "model").save_pretrained(folder)
    return folder


def _mu_update(model_dir: Path, tiny_world, *extra: str) -> dict:
    """``rubric_update`` over the two hand-built episodes (micro-batches of one trajectory, no
    optimizer step yet: grad_accum counts π's micro-steps too): the bytes autograd saved, the
    training flags its forwards saw, the scores it wrote and the gradients it left, next to
    ``score_items``'s scores on the same weights."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    cfg = cfg_for(tiny_world, f"assets.model={model_dir}", "rl.micro_batch_size=1", *extra)
    torch.manual_seed(0)
    model = build_arco_model(model_dir, cfg.lora.as_peft(), cfg.rubric.head_k)
    with torch.no_grad():  # every weight off its start: KL > 0, every LoRA matrix a gradient
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    cfg.train.grad_accum = 4  # μ's two micro-steps and π's two: no boundary inside μ's
    train = TrainEngine(
        model, cfg.train, param_groups=model.groups({"policy": 1e-2, "rubric": 1e-2, "head": 1e-2})
    )
    items = make_rubric_items(cfg, EPISODES, tokenizer)
    for it in items:  # criteria as μ would have written them
        it.criteria_ids = encode_text(tokenizer, format_criteria(["a", "b", "c"])) + [
            tokenizer.eos_token_id
        ]
    score_items(model, items, tokenizer.pad_token_id, 8, shared=cfg.rubric.shared_prefix)
    deterministic = [list(it.scores) for it in items]
    for it in items:
        it.scores = []
    modes: list[tuple[str, bool, bool]] = []  # (adapter, model.training, every layer training)
    layers = model.lm.get_base_model().model.layers

    def seen(module, args) -> None:
        modes.append((args[0], module.training, all(layer.training for layer in layers)))

    model.register_forward_pre_hook(seen)
    with saved_bytes() as saved:
        rubric_update(train, items, torch.tensor([1.0, 0.0]), cfg, tokenizer.pad_token_id, {})
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {
        "saved": saved[0],
        "modes": modes,
        "scores": [it.scores for it in items],
        "deterministic": deterministic,
        "grads": grads,
        "training_after": model.training,
        "dropout_after": {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)},
    }


@pytest.mark.parametrize("shared", ["true", "false"])
def test_mu_update_is_checkpointed_in_training_mode(deep_model, tiny_world, shared):
    runs = {
        on: _mu_update(
            deep_model,
            tiny_world,
            f"train.gradient_checkpointing={str(on).lower()}",
            f"rubric.shared_prefix={shared}",
            "lora.lora_dropout=0.1",
        )
        for on in (False, True)
    }
    on, off = runs[True], runs[False]
    # with checkpointing each of the 8 layers keeps its input and one layer is recomputed: far
    # less than every layer's saved tensors (eval mode, today's bug, saves as much as off)
    assert 0 < on["saved"] < 0.4 * off["saved"], (on["saved"], off["saved"])
    # the update's forwards, μ's (with gradient) in training mode, μ_ref's (no gradient) in eval
    assert [m for m in on["modes"] if m[0] == "rubric"] == [("rubric", True, True)] * 2
    assert {m[1] for m in on["modes"] if m[0] == "rubric_ref"} == {False}
    assert on["training_after"] and on["dropout_after"] == {0.1}
    # the scores are the deterministic μ's, with or without checkpointing, dropout 0.1
    for run in (on, off):
        torch.testing.assert_close(
            torch.tensor(run["scores"]), torch.tensor(run["deterministic"]), rtol=0, atol=1e-6
        )
    print(f"mu update saved bytes: checkpointing on {on['saved']}, off {off['saved']}")


def test_mu_update_gradients_are_the_deterministic_mus(deep_model, tiny_world):
    """LoRA dropout 0.3 and checkpointing, with μ_ref's KL (an eval-mode forward inside the
    update, which puts the modules back in training mode before the backward recomputes the
    layers): the gradients of a model without dropout and without checkpointing."""
    run = _mu_update(
        deep_model,
        tiny_world,
        "train.gradient_checkpointing=true",
        "lora.lora_dropout=0.3",
        "rl.mu_kl_coef=0.05",
    )
    plain = _mu_update(
        deep_model,
        tiny_world,
        "train.gradient_checkpointing=false",
        "lora.lora_dropout=0.0",
        "rl.mu_kl_coef=0.05",
    )
    assert run["grads"].keys() == plain["grads"].keys()
    assert any(".rubric." in n for n in run["grads"]) and any("head." in n for n in run["grads"])
    for name, grad in plain["grads"].items():
        torch.testing.assert_close(run["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
