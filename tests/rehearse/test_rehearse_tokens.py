"""Tokens through the model next to the cost model: the report's table on hand-built metrics
rows, the trainers' counts (``policy_update``, CER's scorer) against hand counts and against
``benchmarks/cost_model.py`` on the same shapes."""

from __future__ import annotations

import pytest
import torch
import transformers

from cer.rewards.scoring_tokens import CountingScorer, scoring_tokens
from common.rl_loop import LossConfig, policy_update
from common.rollout import Trajectory
from common.token_counts import rollout_token_metrics
from common.train import TrainConfig, TrainEngine
from experiments.rehearse.runner import Report
from experiments.rehearse.stages import StageResult
from experiments.rehearse.tokens import cost_model, token_table


def shape_row(step: int, groups: int, trajs: int, prompt: int, response: int, **tokens) -> dict:
    return {
        "step": step,
        "loss": 0.0,
        "shape/groups": groups,
        "shape/trajectories": trajs,
        "shape/prompt_tokens": prompt,
        "shape/response_tokens": response,
        **{f"tokens/{k}": v for k, v in tokens.items()},
    }


def by_category(table: list[dict]) -> dict[str, dict]:
    return {e["category"]: e for e in table}


def test_the_table_sums_the_steps_and_models_each_steps_shapes():
    # step 1: B 2, G 4, prompts 2 x 10, responses 8 x 5 -> generation 20 + 40 = 60,
    # update 8 x 10 + 40 = 120; step 2: B 2, G 4, prompts 2 x 12, responses 8 x 3 ->
    # generation 24 + 24 = 48, update 8 x 12 + 24 = 120. The update's padding: 150 + 130.
    rows = [
        shape_row(1, 2, 8, 20, 40, generation=60, update=120, update_padded=150, reference=0),
        shape_row(2, 2, 8, 24, 24, generation=48, update=110, update_padded=130, reference=0),
        {"step": 2, "dev/em": 0.5},  # an evaluation row: no shapes, not counted
    ]
    table = by_category(token_table(rows, "eviback", {"loss": {"kl_coef": 0.0}}))
    assert list(table) == ["generation", "update", "reference", "update (padded)"]
    gen, upd, ref, pad = (table[k] for k in table)
    assert (gen["measured"], gen["model"], gen["ratio"]) == (108, 108, 1.0)
    assert (upd["measured"], upd["model"]) == (230, 240)
    assert upd["ratio"] == pytest.approx(230 / 240)
    assert (ref["measured"], ref["model"], ref["ratio"]) == (0, 0, 1.0)  # no KL: none, both
    assert (pad["measured"], pad["model"]) == (280, 240)
    assert gen["steps"] == "1-2" and "prefix caching" in gen["note"]


def test_a_kl_term_models_the_reference_forward_and_the_teacher_is_not_compared():
    rows = [shape_row(3, 1, 2, 7, 9, generation=16, update=23, reference=23)]
    rows[0]["teacher/tokens"] = 500
    table = by_category(token_table(rows, "eviback", {"loss": {"kl_coef": 0.001}}))
    # B 1, G 2, prompt 7, responses 9 in all: update 2 x 7 + 9 = 23, the reference the same
    assert (table["reference"]["model"], table["reference"]["ratio"]) == (23, 1.0)
    assert table["reference"]["steps"] == "3"
    teacher = table["teacher (external)"]
    assert teacher["measured"] == 500 and teacher["model"] is None and teacher["ratio"] is None


def test_cer_reward_is_modelled_by_the_prefix_scorer_count():
    # B 2, G 2, prompts 2 x 4, responses 4 x 3: per group prompt 4 + 2 solutions x 3 + 4
    # answers x 6 tokens x 2 solutions = 4 + 6 + 48 = 58; two groups 116
    raw = {"loss": {"kl_coef": 0.0}, "reward": {"type": "cer", "scorer_batch_size": 8}}
    rows = [shape_row(1, 2, 4, 8, 12, generation=20, reward=90, reward_samples=40, update=28)]
    table = by_category(token_table(rows, "cer", raw))
    assert (table["reward"]["measured"], table["reward"]["model"]) == (90, 116)
    assert table["reward"]["ratio"] == pytest.approx(90 / 116)
    assert "4 candidate answers of 6 tokens" in table["reward"]["note"]
    assert table["reward (samples/)"]["model"] is None
    exact = by_category(token_table(rows, "cer", raw | {"reward": {"type": "exact"}}))
    assert exact["reward"]["model"] == 0 and exact["reward"]["ratio"] is None  # 90 vs none


def test_arco_models_pi_ref_on_its_late_steps_only_and_reports_mu_unmodelled():
    raw = {"rl": {"pi_kl_coef": 0.01}}
    # B 2, G 4, prompts 2 x 10, responses 8 x 5: update 8 x 10 + 40 = 120 each step
    early = shape_row(1, 2, 8, 20, 40, generation=60, update=120, reference=0, mu_rows=900)
    late = shape_row(2, 2, 8, 20, 40, generation=60, update=120, reference=120, mu_rows=700)
    late["pi_late_schedule"], early["tokens/rubric_generation"] = 1.0, 800
    table = by_category(token_table([early, late], "arco", raw))
    assert list(table) == ["generation", "rubric generation (μ)", "μ rows", "update", "reference"]
    assert (table["update"]["model"], table["update"]["ratio"]) == (240, 1.0)
    assert (table["reference"]["measured"], table["reference"]["model"]) == (120, 120)
    assert table["μ rows"]["measured"] == 1600 and table["μ rows"]["model"] is None
    assert table["rubric generation (μ)"]["measured"] == 800
    early["tokens/mu_packed"], late["tokens/mu_packed"] = 500, 400
    table = by_category(token_table([early, late], "arco", raw))
    assert table["μ rows packed"]["measured"] == 900 and table["μ rows packed"]["model"] is None


def test_arco_counts_pi_rows_and_mu_rows_whole():
    from arco.rubrics import RubricItem
    from arco.step_tokens import arco_token_metrics

    trajs = trajectories()
    items = [RubricItem(0, 0, [1] * 7, [2] * 3), RubricItem(1, 0, [1] * 5, [2] * 2, written=False)]
    counts = arco_token_metrics(trajs, items, pi_reference=True)
    # π: 2 x 3 + 2 x 5 + 10 = 26, π_ref the same; μ: rows 10 + 7, the written one 10
    assert counts["tokens/update"] == counts["tokens/reference"] == 26
    assert counts["tokens/mu_rows"] == 17 and counts["tokens/rubric_generation"] == 10
    assert counts["tokens/generation"] == 18 and counts["shape/groups"] == 2
    assert arco_token_metrics(trajs, [], pi_reference=False)["tokens/reference"] == 0
    assert counts["tokens/mu_packed"] == 17  # two trajectories, nothing shared
    # one trajectory's two rows (7 and 6 ids) share their first 4: 7 + (6 - 4) packed, 13 whole
    same = [RubricItem(0, 0, [1, 2, 3, 4, 5], [9, 9]), RubricItem(0, 1, [1, 2, 3, 4, 6], [8])]
    packed = arco_token_metrics(trajs, same, pi_reference=False, shared_prefix=True)
    assert (packed["tokens/mu_rows"], packed["tokens/mu_packed"]) == (13, 9)
    assert arco_token_metrics(trajs, same, pi_reference=False)["tokens/mu_packed"] == 13


def test_rows_without_shapes_give_no_table_and_the_report_says_so():
    assert token_table([{"step": 1, "loss": 0.0}], "arco", {}) == []
    table = token_table([shape_row(1, 1, 1, 3, 2, generation=5, update=5)], "cer", {})
    with_tokens = StageResult("train", True, 1.0, 10.0, "log", counts={"n": 1, "tokens": table})
    report = Report("cer/configs/x.yaml", None, 1, "cpu", stages=[with_tokens])
    text = report.markdown()
    assert "| train | 1 | generation | 5 | 5 | 1.000 |" in text
    assert "| train | 1 | reward | 0 | 0 | 1.000 | no model in the reward" in text
    assert "tokens [" not in text  # the stage table's counts leave the token table out
    bare = Report("a.yaml", None, 1, "cpu", stages=[StageResult("train", True, 1.0, 1.0, "l")])
    assert "logged `tokens/*`" in bare.markdown()


# ------------------------------------------------------------------- the trainers' own counts


def trajectories() -> list[Trajectory]:
    """Group a: prompt 3, responses 2 and 4; group b: prompt 5, responses 1 and 3."""
    out = []
    for group, prompt, responses in (("a", [1, 2, 3], (2, 4)), ("b", [4, 5, 6, 7, 8], (1, 3))):
        for i, r in enumerate(responses):
            t = Trajectory(group, i, "q", "q", ["x"], list(prompt))
            t.append([9] * r, sampled=True, logprobs=[0.0] * r)
            out.append(t)
    return out


def tiny_engine(reference: bool) -> TrainEngine:
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).float()
    return TrainEngine(model, TrainConfig(lr=1e-3, grad_accum=2), reference=reference)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_policy_update_counts_equal_the_cost_model_on_the_same_shapes(kl_coef):
    trajs = trajectories()
    shapes = rollout_token_metrics(trajs)
    # prompts once a group 3 + 5, responses 2 + 4 + 1 + 3 = 10: generation 18
    assert shapes == {
        "tokens/generation": 18, "shape/groups": 2, "shape/trajectories": 4,
        "shape/prompt_tokens": 8, "shape/response_tokens": 10,
    }  # fmt: skip
    cfg = LossConfig(micro_batch_size=2, kl_coef=kl_coef)
    stats = policy_update(tiny_engine(kl_coef > 0), trajs, torch.tensor([1.0, -1, 1, -1]), cfg, 0)
    # real: 2 x 3 + 2 x 5 + 10 = 26; padded: [a] 2 rows x 7, [b] 2 rows x 8 = 30
    assert stats["tokens/update"] == 26 and stats["tokens/update_padded"] == 30
    assert stats["tokens/reference"] == (26 if kl_coef else 0)
    cm = cost_model()
    model = cm.step_tokens(cm.StepShapes.from_metrics(shapes), kl_coef)
    ref = stats["tokens/reference"]
    assert model == {"generation": 18, "reward": 0, "update": 26, "reference": ref}


def test_cer_scoring_tokens_follow_the_prefix_scorer_and_equal_the_cost_models_layout():
    prompt = [1, 2, 3]
    s1, s2 = prompt + [4, 5], prompt + [6, 7, 8]
    prefixes = [s1, s1, s2, s2, prompt + [9]]
    continuations = [[10, 11], [12], [10, 11], [12], []]  # the last solution has no answer
    # trunk: the prompt (3) once; own suffixes 2 + 3; continuations 2 + 1 + 2 + 1; the
    # unanswered solution is not forwarded
    assert scoring_tokens(prefixes, continuations) == 3 + 5 + 6
    assert scoring_tokens(prefixes, continuations, [None, None, object(), object(), None]) == (
        3 + 2 + 6  # s2 continues from its generation cache: its continuations alone
    )
    whole = scoring_tokens(prefixes, continuations, whole=True)
    assert whole == (5 + 2) + (5 + 1) + (6 + 2) + (6 + 1)
    count = cost_model().cer_group_scoring(3, [2, 3], [2, 1], batch_size=8)
    assert count.real == scoring_tokens(prefixes[:4], continuations[:4])
    scorer = CountingScorer(lambda p, c, a=None, g=None: [[0.0] * len(x) for x in c])
    assert scorer(prefixes, continuations) == [[0.0] * len(c) for c in continuations]
    assert scorer.take() == 14 and scorer.take() == 0
