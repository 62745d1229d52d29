"""``arco diagnose``: action identification (candidates, ties, a μ taught which criteria go with
which action, so the answer is known) and the score distributions per bucket."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_arco_run import overrides

from arco.config import ArcoConfig
from arco.diagnose import (
    action_identification,
    criteria_loglik,
    identification_cases,
    markdown,
    pick_share,
    plot,
    score_distributions,
)
from arco.losses import rubric_sft_loss
from arco.rubric_model import build_arco_model
from arco.rubric_prompt import format_criteria
from arco.rubrics import RubricItem, rubric_batch
from arco.steps import AgentStep, Episode
from arco.trainer import make_rubric_items
from common.config import load_config
from common.rl import logprobs_from_logits
from common.rollout.agent import encode_text

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"


def ep(qid: str, actions: list[str], reward: float, kinds: list[str] | None = None) -> Episode:
    kinds = kinds or ["search"] * (len(actions) - 1) + ["answer"]
    steps = [
        AgentStep(k, a, "", 3 - i) for i, (k, a) in enumerate(zip(kinds, actions, strict=True))
    ]
    return Episode(qid, f"question {qid}", ["x"], steps, None, reward)


def test_candidates_are_the_other_rollouts_actions_at_the_same_step():
    eps = [
        ep("q1", ["S[a]", "F[x]"], 1.0),
        ep("q1", ["S[b]", "F[y]", "F[z]"], 0.0),
        ep("q1", ["S[a]", "F[x]"], 1.0),  # same actions as the first: no new candidate
        ep("q2", ["S[c]"], 0.0),  # alone: nothing to tell apart
    ]
    cases = identification_cases(eps, max_candidates=4)
    got = [(c.episode, c.step, c.candidates, c.truth) for c in cases]
    assert got == [
        (0, 0, ["S[a]", "S[b]"], 0),
        (0, 1, ["F[x]", "F[y]"], 0),
        (1, 0, ["S[a]", "S[b]"], 1),
        (1, 1, ["F[x]", "F[y]"], 1),
        (2, 0, ["S[a]", "S[b]"], 0),
        (2, 1, ["F[x]", "F[y]"], 0),
    ]  # step 2 of the second episode has no counterpart: left out
    four = [ep("q", [f"S[{a}]"], 0.0) for a in "dcba"]
    first = identification_cases(four, max_candidates=2)[0]
    assert first.candidates == ["S[c]", "S[d]"] and first.truth == 1  # real one always kept


def test_pick_share_counts_ties_as_a_share():
    assert pick_share([-1.0, -2.0, -3.0], 0) == 1.0
    assert pick_share([-1.0, -2.0, -3.0], 1) == 0.0
    assert pick_share([-1.0, -1.0, -3.0], 1) == 0.5  # chance level when μ cannot tell
    assert pick_share([-1.0, -1.0, -1.0], 2) == pytest.approx(1 / 3)


def test_score_distributions_by_bucket_and_outcome():
    eps = [ep("q1", ["S[a]", "F[x]"], 1.0), ep("q1", ["S[b]", "S[c]", "F[y]"], 0.0)]
    scores = [[0.2, 0.8], [-0.1, -0.3, 0.4]]
    items = [
        RubricItem(i, t, [1], scores=[s, s])
        for i, row in enumerate(scores)
        for t, s in enumerate(row)
    ]
    dist = score_distributions(eps, items)
    assert dist == {
        "search_1": {"correct": [0.2], "wrong": [-0.1]},
        "search_2": {"correct": [], "wrong": [-0.3]},
        "terminal": {"correct": [0.8], "wrong": [0.4]},
    }
    table = markdown({"checkpoint": "c", "trajectories": 2, "identification": None, "scores": dist})
    assert "| search_2 | 0 | – | – | 1 | -0.300 | 0.000 |" in table and "n/a" in table


@pytest.mark.slow
def test_a_mu_taught_which_criteria_go_with_which_action_is_identified(tiny_world, tmp_path):
    """Two rollouts of one question differ in their first action; μ is taught (SFT on the
    criteria tokens) to write criteria X after action A and Y after action B. Given X it must
    pick A, given Y it must pick B: accuracy 1 against chance 0.5; swapping the criteria makes
    every pick wrong."""
    from transformers import AutoTokenizer

    cfg = load_config(
        ArcoConfig,
        CONFIG,
        [f"assets.model={tiny_world / 'model'}", "lora.r=8", "lora.lora_alpha=16"],
    )
    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    eps = [
        ep("q1", ["<search> mill </search>", "<answer> ann </answer>"], 1.0),
        ep("q1", ["<answer> tamsford </answer>"], 0.0),
    ]
    crit = {
        0: encode_text(tok, format_criteria(["search names the mill"])) + [tok.eos_token_id],
        1: encode_text(tok, format_criteria(["answer only with evidence"])) + [tok.eos_token_id],
    }
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.k)
    items = make_rubric_items(cfg, eps, tok)
    for it in items:
        it.criteria_ids = list(crit[it.traj]) if it.step == 0 else list(crit[0])
    first = [it for it in items if it.step == 0]
    params = [p for n, p in model.named_parameters() if ".rubric." in n and p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    ids, attn, mask = rubric_batch(first, tok.pad_token_id, torch.device("cpu"))
    for _ in range(40):
        logits, scores = model("rubric", ids, attn, pool_mask=attn)
        logp = logprobs_from_logits(logits[:, :-1], ids[:, 1:])
        loss = rubric_sft_loss(logp, mask, scores, scores.detach(), 0.0)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def make(variants):
        return make_rubric_items(cfg, variants, tok)

    # the criteria log-likelihoods (head at the criteria positions only) equal the whole logits'
    with torch.no_grad():
        logits, _ = model.eval()("rubric", ids, attn)
        whole = (logprobs_from_logits(logits[:, :-1], ids[:, 1:]) * mask).sum(-1).tolist()
    got = criteria_loglik(model.train(), first, tok.pad_token_id, 1)
    assert got == pytest.approx(whole, rel=1e-5) and all(v < 0 for v in got)

    only_first = [it for it in items if it.step == 0]
    out = action_identification(model, eps, only_first, make, tok.pad_token_id, 4, 8)
    # the second step of rollout 0 has no counterpart (rollout 1 has one step): 2 cases
    assert out["cases"] == 2 and out["chance"] == 0.5 and out["mean_candidates"] == 2.0
    assert out["accuracy"] == 1.0
    for it in only_first:  # criteria swapped: each now fits the other action
        it.criteria_ids = list(crit[1 - it.traj])
    assert action_identification(model, eps, only_first, make, tok.pad_token_id)["accuracy"] == 0.0
    plot(score_distributions(eps, [RubricItem(i, 0, [1], scores=[0.1]) for i in (0, 1)]
                             + [RubricItem(0, 1, [1], scores=[0.3])]), tmp_path / "p.png")  # fmt: skip
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.slow
def test_diagnose_command_writes_table_plot_json_and_logs_into_the_run(tiny_world, tmp_path):
    """The whole command on a fresh μ saved as the run's step-3 checkpoint (HF engine): its
    numbers are whatever an untrained μ gives, their bookkeeping is checked."""
    import json

    from arco.cli import main
    from arco.rubric_model import save_arco
    from arco.trainer import rubric_settings

    over = overrides(tiny_world, tmp_path, backend="hf") + [
        "diagnose.questions=4",
        "diagnose.samples=3",
        "diagnose.max_candidates=3",
    ]
    cfg = load_config(ArcoConfig, CONFIG, over)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.k)
    model.rubric_meta = rubric_settings(cfg)
    ckpt = save_arco(model, tmp_path / "run" / "checkpoints" / "step_3")
    assert main(["diagnose", "--config", str(CONFIG), "--checkpoint", str(ckpt), *over]) == 0
    out = ckpt / "diagnose"
    summary = json.loads((out / "diagnose.json").read_text())
    assert summary["trajectories"] == 12
    n_steps = sum(len(v) for sides in summary["scores"].values() for v in sides.values())
    assert n_steps >= 12 and "terminal" in summary["scores"]
    ident = summary["identification"]
    assert 0.0 <= ident["accuracy"] <= 1.0 and 1 / 3 <= ident["chance"] <= 0.5
    assert (out / "score_distributions.png").stat().st_size > 0
    assert "Action identification:" in (out / "diagnose.md").read_text()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert rows == [
        {
            "step": 3,
            "diag/action_id_accuracy": ident["accuracy"],
            "diag/action_id_chance": ident["chance"],
        }
    ]


def test_warmup_check_of_written_criteria_counts_valid_and_teachers(tiny_world):
    """μ taught to write three criteria X after one action and a broken JSON after the other:
    the warmup's check reads μ's greedy text back and reports half valid; an item whose teacher
    wrote Y (μ writes X) is valid but no match."""
    from transformers import AutoTokenizer

    from arco.warmup import check_written_criteria
    from common.rl_loop import build_engine

    cfg = load_config(
        ArcoConfig,
        CONFIG,
        [f"assets.model={tiny_world / 'model'}", "lora.r=8", "lora.lora_alpha=16",
         "engine.backend=hf", "rubric.max_new_tokens=40", "warmup.check_items=3"],
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    eps = [ep("q1", ["<search> mill </search>"], 0.0), ep("q1", ["<answer> ann </answer>"], 0.0)]
    x = encode_text(tok, format_criteria(["mill", "ann", "ok"])) + [tok.eos_token_id]
    broken = encode_text(tok, '{"criteria": ["mill"') + [tok.eos_token_id]
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.k)
    items = make_rubric_items(cfg, eps, tok)
    items[0].criteria_ids, items[1].criteria_ids = list(x), list(broken)
    params = [p for n, p in model.named_parameters() if ".rubric." in n and p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-2)
    ids, attn, mask = rubric_batch(items, tok.pad_token_id, torch.device("cpu"))
    for _ in range(60):
        logits, scores = model("rubric", ids, attn, pool_mask=attn)
        loss = rubric_sft_loss(logprobs_from_logits(logits[:, :-1], ids[:, 1:]), mask, scores,
                               scores.detach(), 0.0)  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    engine = build_engine(cfg.engine, cfg.assets.model, model.lm, tok, 0, cfg.lora.r)
    row = check_written_criteria(engine, items, cfg.rubric, cfg.warmup, tok.eos_token_id)
    assert row == {"items": 2, "criteria_valid_rate": 0.5, "teacher_match_rate": 1.0}
    other = encode_text(tok, format_criteria(["a", "b", "c"])) + [tok.eos_token_id]
    items[0].criteria_ids = other  # the teacher wrote Y; μ still writes X: valid, no match
    row = check_written_criteria(engine, items[:1], cfg.rubric, cfg.warmup, tok.eos_token_id)
    assert row == {"items": 1, "criteria_valid_rate": 1.0, "teacher_match_rate": 0.0}
    assert items[0].criteria_ids == other  # the check writes into copies
