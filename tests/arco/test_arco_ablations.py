"""ARCO's ablation switches and baselines by config: each changes exactly what it names (the
rubric prompt's text, the head's input, the number of criteria, which parameters get
gradients), on hand-built episodes and the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arco.config import ArcoConfig
from arco.projection import project_scores
from arco.rubric_model import build_arco_model
from arco.rubric_prompt import format_criteria, read_criteria_file
from arco.rubrics import rubric_batch, score_items
from arco.steps import AgentStep, Episode
from arco.teacher import oracle_annotation
from arco.trainer import check_rubric_matches, make_rubric_items, update, update_batch
from arco.warmup import sft_targets, trajectory_from_episode
from common.config import load_config
from common.rollout.agent import encode_text
from common.train import TrainEngine

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
CRITERIA = ROOT / "arco" / "criteria" / "tiny.txt"
LORA = ["lora.r=4", "lora.lora_alpha=8", "lora.target_modules=[q_proj, v_proj]"]

EPISODES = [
    Episode(
        "q1",
        "Who founded Velk Mills?",
        ["Ann Orr"],
        [
            AgentStep(
                "search", "<search> Velk Mills </search>", "Velk Mills was founded by Ann Orr.", 3
            ),
            AgentStep("answer", "<answer> Ann Orr </answer>", "", 2),
        ],
        "Ann Orr",
        1.0,
    ),
    Episode(
        "q2",
        "Where was Ora Velk born?",
        ["Tamsford"],
        [
            AgentStep("search", "<search> Ora Velk </search>", "Ora Velk wrote two films.", 3),
            AgentStep("search", "<search> Ora Velk </search>", "Ora Velk wrote two films.", 2),
            AgentStep("answer", "<answer> Lanterns </answer>", "", 1),
        ],
        "Lanterns",
        0.0,
    ),
]


def cfg_for(tiny_world: Path, *extra: str) -> ArcoConfig:
    return load_config(ArcoConfig, CONFIG, [f"assets.model={tiny_world / 'model'}", *LORA, *extra])


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_world / "model")


def _user_text(tokenizer, item) -> str:
    return tokenizer.decode(item.prompt_ids)


# --- the rubric prompt's text and the head's input -------------------------------------------


def test_mode_none_drops_only_the_request_and_scores_the_prompt_alone(tiny_world, tokenizer):
    adaptive = make_rubric_items(cfg_for(tiny_world), EPISODES, tokenizer)
    none = make_rubric_items(cfg_for(tiny_world, "rubric.mode=none"), EPISODES, tokenizer)
    request = cfg_for(tiny_world).rubric.request.format(k=3, example=format_criteria(["..."] * 3))
    assert len(none) == len(adaptive) == 5
    for a, n in zip(adaptive, none, strict=True):
        a_text, n_text = _user_text(tokenizer, a), _user_text(tokenizer, n)
        assert request in a_text and "JSON" not in n_text
        assert n_text == a_text.replace("\n\n" + request, "")
        assert n.criteria_ids == [] and n.criteria == [] and not n.written
    ids, attn, crit = rubric_batch(none, tokenizer.pad_token_id, torch.device("cpu"))
    for r, it in enumerate(none):  # the head pools over the prompt's tokens and nothing else
        assert ids[r, : len(it.prompt_ids)].tolist() == it.prompt_ids
        assert attn[r].sum().item() == len(it.prompt_ids)
    assert crit.sum().item() == 0  # no criteria tokens: no cross-entropy, no KL for μ


def test_mode_fixed_gives_every_step_the_files_criteria_as_written_text(tiny_world, tokenizer):
    cfg = cfg_for(tiny_world, "rubric.mode=fixed", f"rubric.criteria_file={CRITERIA}")
    fixed = read_criteria_file(str(CRITERIA), 3)
    assert fixed == [
        "finds new support",
        "no repeated search",
        "answer is supported",
    ]
    items = make_rubric_items(cfg, EPISODES, tokenizer)
    adaptive = make_rubric_items(cfg_for(tiny_world), EPISODES, tokenizer)
    want = encode_text(tokenizer, format_criteria(fixed)) + [tokenizer.eos_token_id]
    for it, a in zip(items, adaptive, strict=True):
        assert it.prompt_ids == a.prompt_ids  # the same prompt; only the criteria differ
        assert it.criteria_ids == want and it.criteria == fixed and not it.written
    _, attn, crit = rubric_batch(items, tokenizer.pad_token_id, torch.device("cpu"))
    assert attn[0].sum().item() == len(items[0].prompt_ids) + len(want)  # head sees them
    assert crit.sum().item() == 0  # but μ is not trained to write them


def test_prefix_none_in_the_items_of_trainer_and_warmup(tiny_world, tokenizer):
    before = make_rubric_items(cfg_for(tiny_world), EPISODES, tokenizer)
    none = make_rubric_items(cfg_for(tiny_world, "rubric.prefix=none"), EPISODES, tokenizer)
    for b, n in zip(before, none, strict=True):
        b_text, n_text = _user_text(tokenizer, b), _user_text(tokenizer, n)
        assert "trajectory so far" in b_text.lower() and "trajectory so far" not in n_text.lower()
        assert "searches remaining" not in n_text.lower()
    # step 2 of q2 differs from step 1 only in the prefix: without it the prompts coincide
    assert none[2].prompt_ids == none[3].prompt_ids and before[2].prompt_ids != before[3].prompt_ids


def test_criteria_file_with_the_wrong_count_names_the_file(tmp_path):
    path = tmp_path / "crit.txt"
    path.write_text("# a comment\none\n\ntwo\n")
    assert read_criteria_file(str(path), 2) == ["one", "two"]
    with pytest.raises(ValueError, match=r"crit\.txt: 2 criteria, rubric\.k=3"):
        read_criteria_file(str(path), 3)


# --- the number of criteria -------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_k_sets_the_teachers_criteria_the_request_and_the_head(k, tiny_world, tokenizer):
    cfg = cfg_for(tiny_world, f"rubric.k={k}")
    ann = oracle_annotation(EPISODES[1], k, supporting_ids=["d1"])
    assert all(len(a.criteria) == len(a.scores) == k for a in ann)
    item = make_rubric_items(cfg, EPISODES[1:], tokenizer)[0]
    assert format_criteria(["..."] * k) in _user_text(tokenizer, item)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.head_k)
    assert model.k == k and model.head.net[-2].out_features == k


def test_mode_none_head_has_one_score_whatever_k(tiny_world):
    assert cfg_for(tiny_world, "rubric.mode=none", "rubric.k=4").head_k == 1
    assert cfg_for(tiny_world, "method=prm", "rubric.k=4").head_k == 1
    assert cfg_for(tiny_world, "rubric.k=4").head_k == 4


# --- the PRM baseline's targets ---------------------------------------------------------------


def test_prm_targets_are_the_projected_teacher_step_scores():
    # raw teacher scores of a right trajectory (R = 1): sum 2.4, K·R = 3, so λ = 0.1 and no clip
    projected = project_scores([[0.5, 0.5, 0.5], [0.9, -0.3, 0.3]], 1.0).tolist()
    assert sum(projected, []) == pytest.approx([0.6, 0.6, 0.6, 1.0, -0.2, 0.4], abs=1e-6)
    targets = [sft_targets(row, 1) for row in projected]
    assert sum(targets, []) == pytest.approx([0.6, 0.4], abs=1e-6)  # Σ_t = R
    assert sft_targets(projected[1], 3) == pytest.approx([1.0, -0.2, 0.4], abs=1e-6)
    with pytest.raises(ValueError):
        sft_targets(projected[1], 2)


# --- methods and the frozen μ -----------------------------------------------------------------


def test_method_presets(tiny_world):
    """A method's reading of the sections (``ArcoConfig``'s properties); the sections keep what
    was set, so config.yaml records it as given."""
    prm = cfg_for(tiny_world, "method=prm")
    assert (prm.rubric_mode, prm.head_k, prm.mu_frozen, prm.uses_mu) == ("none", 1, True, True)
    assert (prm.rubric.mode, prm.rl.freeze_rubric) == ("adaptive", False)
    out = cfg_for(tiny_world, "method=outcome_only", "rl.sparse_steps=10", "rl.dense_steps=10")
    assert (out.sparse_steps, out.dense_steps, out.steps, out.pi_switch_step) == (20, 0, 20, 10)
    assert (out.rl.sparse_steps, out.rl.dense_steps, out.rl.pi_dense_from) == (10, 10, -1)
    assert out.mu_frozen and not out.uses_mu and not out.rl.freeze_rubric
    arco = cfg_for(tiny_world)
    assert (arco.rubric_mode, arco.head_k, arco.mu_frozen, arco.uses_mu) == (
        "adaptive",
        3,
        False,
        True,
    )
    assert (arco.sparse_steps, arco.dense_steps, arco.pi_switch_step) == (10, 10, 10)
    frozen = cfg_for(tiny_world, "rl.freeze_rubric=true")
    assert frozen.mu_frozen and frozen.uses_mu and frozen.rubric_mode == "adaptive"
    with pytest.raises(ValueError, match="method=prm"):
        cfg_for(tiny_world, "method=prm", "rubric.mode=fixed", f"rubric.criteria_file={CRITERIA}")
    with pytest.raises(ValueError, match="criteria_file"):
        cfg_for(tiny_world, "rubric.mode=fixed")
    with pytest.raises(ValueError, match="'method'.*got 'rubric'"):  # a Literal
        cfg_for(tiny_world, "method=rubric")


def test_missing_criteria_file_is_a_missing_asset(tiny_world):
    cfg = cfg_for(tiny_world, "rubric.mode=fixed", "rubric.criteria_file=nowhere.txt")
    with pytest.raises(FileNotFoundError, match="rubric.criteria_file: 'nowhere.txt'"):
        cfg.check_assets(("model",))


def test_a_warmup_for_another_rubric_is_refused(tiny_world):
    model = build_arco_model(tiny_world / "model", cfg_for(tiny_world).lora.as_peft(), 3)
    model.rubric_meta = {"mode": "adaptive", "prefix": "before", "k": 3}
    check_rubric_matches(cfg_for(tiny_world), model, "w")
    check_rubric_matches(cfg_for(tiny_world, "rubric.prefix=after"), model, "w")  # release
    with pytest.raises(ValueError, match="gives 3 scores a step"):
        check_rubric_matches(cfg_for(tiny_world, "rubric.mode=none"), model, "w")
    with pytest.raises(ValueError, match="rubric.prefix=before"):
        check_rubric_matches(cfg_for(tiny_world, "rubric.prefix=none"), model, "w")
    fixed = cfg_for(tiny_world, "rubric.mode=fixed", f"rubric.criteria_file={CRITERIA}")
    with pytest.raises(ValueError, match="rubric.mode=adaptive"):
        check_rubric_matches(fixed, model, "w")
    # the request's place (a folder written before the option was the user layout)
    with pytest.raises(ValueError, match="rubric.request_in=user, this run has system"):
        check_rubric_matches(cfg_for(tiny_world, "rubric.request_in=system"), model, "w")
    model.rubric_meta = {**model.rubric_meta, "request_in": "system"}
    check_rubric_matches(cfg_for(tiny_world, "rubric.request_in=system"), model, "w")


def _changed_after_one_update(tiny_world, tokenizer, *extra: str) -> dict:
    """One dense update on the two hand-built episodes; which trained parts moved, and the
    update's statistics. Every weight, references included, is moved off its start first, so
    the adapters differ from their references (KL > 0) and every LoRA matrix has a gradient."""
    cfg = cfg_for(tiny_world, "rl.micro_batch_size=2", "rl.mu_kl_coef=0.05", *extra)
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.head_k)
    with torch.no_grad():  # LoRA B starts at 0, which zeroes A's gradient: move every weight
        g = torch.Generator().manual_seed(1)
        for _, p in model.named_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    if cfg.mu_frozen:
        model.freeze_rubric()
    lrs = {"policy": 1e-2, "rubric": 1e-2, "head": 1e-2}
    train = TrainEngine(model, cfg.train, param_groups=model.groups(lrs))
    trajs = [trajectory_from_episode(ep, tokenizer, cfg.agent) for ep in EPISODES]
    items = make_rubric_items(cfg, EPISODES, tokenizer)
    for it in items:  # criteria as μ would have written them (no engine needed)
        if it.written:
            it.criteria_ids = encode_text(tokenizer, format_criteria(["a", "b", "c"]))
            it.criteria_ids.append(tokenizer.eos_token_id)
    score_items(model, items, tokenizer.pad_token_id, 8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    adv = [[0.5, -0.2], [0.1, -0.3, 0.4]]
    batch = update_batch(trajs, items, adv, torch.tensor([1.0, 0.0]), late=True)
    stats = update(train, batch, cfg, tokenizer.pad_token_id)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    parts = {"policy": set(), "rubric": set(), "head": set(), "other": set()}
    for n in moved:
        part = next((k for k in ("policy", "rubric") if f".{k}." in n), None)
        parts["head" if n.startswith("head.") else part or "other"].add(n)
    parts["stats"] = stats
    return parts


def test_co_evolution_trains_pi_mu_and_the_head(tiny_world, tokenizer):
    parts = _changed_after_one_update(tiny_world, tokenizer)
    assert parts["policy"] and parts["rubric"] and parts["head"] and not parts["other"]
    assert "mu_decomp_loss" in parts["stats"] and parts["stats"]["mu_kl"] > 0


def test_frozen_mu_gets_no_gradient_and_pi_still_learns(tiny_world, tokenizer):
    parts = _changed_after_one_update(tiny_world, tokenizer, "rl.freeze_rubric=true")
    assert parts["policy"] and not parts["rubric"] and not parts["head"] and not parts["other"]
    assert "mu_decomp_loss" not in parts["stats"]


def test_prm_keeps_its_scalar_head_frozen(tiny_world, tokenizer):
    parts = _changed_after_one_update(tiny_world, tokenizer, "method=prm")
    assert parts["policy"] and not parts["rubric"] and not parts["head"]


def test_fixed_criteria_train_the_head_and_adapter_without_a_criteria_kl(tiny_world, tokenizer):
    parts = _changed_after_one_update(
        tiny_world, tokenizer, "rubric.mode=fixed", f"rubric.criteria_file={CRITERIA}"
    )
    assert parts["rubric"] and parts["head"]
    assert parts["stats"]["mu_kl"] == 0.0  # the criteria are not μ's: nothing to hold near μ_ref
