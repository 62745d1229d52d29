"""ARCO's model: one base, four adapters, the head; which loss reaches which weights; save/load."""

from __future__ import annotations

import pytest
import torch

from arco.rubric_model import ArcoModel, ScoreHead, build_arco_model, mean_pool, save_arco

LORA = {
    "r": 4,
    "lora_alpha": 8,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj", "up_proj"],
}


@pytest.fixture(scope="module")
def model_path(tiny_world):
    return tiny_world / "model"


@pytest.fixture()
def model(model_path) -> ArcoModel:
    torch.manual_seed(0)
    return build_arco_model(model_path, LORA, k=3)


def _ids(n: int = 2, t: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (n, t), generator=g)
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    return ids, mask


def _grads(model: ArcoModel) -> dict[str, bool]:
    """Which parameters got a non-zero gradient."""
    return {
        n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in model.named_parameters()
    }


def _perturb(model: ArcoModel, scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g))


def test_one_copy_of_the_base(model, model_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path)
    base_numel = sum(p.numel() for p in base.parameters())
    non_lora = sum(
        p.numel()
        for n, p in model.named_parameters()
        if "lora_" not in n and not n.startswith("head.")
    )
    assert non_lora == base_numel  # π, μ, π_ref, μ_ref share it: no second copy
    adapters = {
        n.split(".lora_")[1].split(".")[1] for n, _ in model.named_parameters() if "lora_" in n
    }
    assert adapters == {"policy", "rubric", "policy_ref", "rubric_ref"}


def test_trainable_set_is_the_two_adapters_and_the_head(model):
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable
    for n in trainable:
        assert n.startswith("head.") or ".policy." in n or ".rubric." in n
    for n, p in model.named_parameters():
        if "_ref." in n or ("lora_" not in n and not n.startswith("head.")):
            assert not p.requires_grad, n
    model.use("policy_ref")  # peft would make the active adapter trainable; use() keeps the set
    assert {n for n, p in model.named_parameters() if p.requires_grad} == trainable


def test_fresh_adapters_equal_the_base_and_references_start_equal(model, model_path):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path).eval()
    ids, mask = _ids()
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        for name in ("policy", "rubric", "policy_ref", "rubric_ref"):
            got, _ = model(name, ids, mask)
            torch.testing.assert_close(got, want)


def test_policy_loss_reaches_only_the_policy_adapter(model):
    _perturb(model)  # LoRA B = 0 at start would leave A's gradient zero
    ids, mask = _ids()
    logits, _ = model("policy", ids, mask)
    logits.float().pow(2).mean().backward()
    got = _grads(model)
    touched = {n for n, g in got.items() if g}
    assert touched and all(".policy." in n for n in touched)
    assert any("lora_A.policy" in n for n in touched) and any("lora_B.policy" in n for n in touched)


def test_rubric_loss_reaches_only_the_rubric_adapter_and_the_head(model):
    _perturb(model)
    ids, mask = _ids()
    logits, scores = model("rubric", ids, mask, pool_mask=mask)
    (logits.float().pow(2).mean() + scores.sum()).backward()
    touched = {n for n, g in _grads(model).items() if g}
    assert any(n.startswith("head.") for n in touched)
    assert any(".rubric." in n for n in touched)
    assert all(n.startswith("head.") or ".rubric." in n for n in touched)


def test_head_is_float32_in_range_and_pools_over_the_mask():
    head = ScoreHead(hidden_size=6, k=4)
    assert [type(m).__name__ for m in head.net] == [
        "Linear",
        "GELU",
        "Linear",
        "GELU",
        "Linear",
        "Tanh",
    ]
    assert [m.out_features for m in head.net if hasattr(m, "out_features")] == [512, 128, 4]
    d = head(torch.randn(3, 6, dtype=torch.bfloat16) * 100)
    assert d.dtype == torch.float32 and d.shape == (3, 4) and d.abs().max() <= 1
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    torch.testing.assert_close(
        mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]])
    )


def test_save_and_load_round_trip_and_references_follow_the_loaded_adapters(
    model, model_path, tmp_path
):
    _perturb(model)
    ids, mask = _ids()
    model.eval()
    with torch.no_grad():
        pi, _ = model("policy", ids, mask)
        mu, d = model("rubric", ids, mask, pool_mask=mask)
    save_arco(model, tmp_path / "w")
    loaded = build_arco_model(model_path, {"r": 99}, k=7, init_from=tmp_path / "w").eval()
    assert loaded.k == 3 and loaded.lora["r"] == LORA["r"]  # the folder's settings win
    with torch.no_grad():
        torch.testing.assert_close(loaded("policy", ids, mask)[0], pi)
        got_mu, got_d = loaded("rubric", ids, mask, pool_mask=mask)
        torch.testing.assert_close(got_mu, mu)
        torch.testing.assert_close(got_d, d)
        torch.testing.assert_close(loaded("policy_ref", ids, mask)[0], pi)
        torch.testing.assert_close(loaded("rubric_ref", ids, mask)[0], mu)


def test_groups_split_the_trainable_parameters(model):
    groups = model.groups({"policy": 1e-3, "rubric": 2e-3, "head": 3e-3})
    assert [g["name"] for g in groups] == ["policy", "rubric", "head"]
    assert [g["lr"] for g in groups] == [1e-3, 2e-3, 3e-3]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == sum(p.requires_grad for p in model.parameters())


def test_loading_a_folder_that_is_not_arco_says_so(model_path, tmp_path):
    with pytest.raises(FileNotFoundError, match="arco warmup"):
        build_arco_model(model_path, LORA, k=3, init_from=tmp_path)
