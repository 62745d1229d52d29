"""``arco.step_scorer.RubricSteps``: a saved μ as a standalone step scorer. Its scores are the
head's on the rubric rows built from the trajectories' text (checked against a per-row forward
of the same μ, fp32), μ is in eval mode, its budget and folder settings reach the prompts, and the
search GRPO loop trains with ARCO's dense advantages from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_arco_run import overrides
from transformers import AutoTokenizer

from arco.config import ArcoConfig
from arco.rubric_model import build_arco_model, save_arco
from arco.rubrics import rubric_batch
from arco.step_scorer import RubricSteps
from arco.steps import episode_from_trajectory
from arco.trainer import make_rubric_items, rubric_settings
from common.config import load_config
from common.rewards import RewardContext, groups_of, load_part
from common.rollout.agent import encode_text
from common.rollout.trajectory import Step, Trajectory

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"


def mu_overrides(world: Path, out: Path) -> list[str]:
    return overrides(world, out, backend="hf") + ["rubric.max_new_tokens=12"]


@pytest.fixture(scope="module")
def mu_folder(tiny_world, tmp_path_factory) -> tuple[Path, list[str]]:
    """A fresh μ (random head, rubric adapter at its init) saved as an ARCO warmup folder."""
    out = tmp_path_factory.mktemp("mu")
    over = mu_overrides(tiny_world, out)
    cfg = load_config(ArcoConfig, CONFIG, over)
    torch.manual_seed(0)
    model = build_arco_model(tiny_world / "model", cfg.lora.as_peft(), cfg.rubric.head_k)
    model.rubric_meta = rubric_settings(cfg)
    return save_arco(model, out / "warmup"), over


def trajectory(tok, k: int, parts: list[tuple[str, str, str]], answer: str | None) -> Trajectory:
    """A trajectory whose response is ``parts`` (kind, action text, observation text) in order,
    each action a sampled step, each observation inserted after it."""
    t = Trajectory("g", k, "q1", "Where was Ann born?", ["Oslo"], [1, 2, 3], answer=answer)
    for kind, action, obs in parts:
        start = len(t.response_ids)
        ids = encode_text(tok, action)
        t.append(ids, sampled=True, logprobs=[0.0] * len(ids))
        t.steps.append(Step(kind, start, len(t.response_ids), observation=obs))
        if obs:
            t.append(encode_text(tok, f" {obs} "), sampled=False)
    return t


def batch(tok) -> list[Trajectory]:
    return [
        trajectory(tok, 0, [("search", "<search> ann </search>", "Ann lives in Oslo."),
                            ("answer", "<answer> Oslo </answer>", "")], "Oslo"),
        trajectory(tok, 1, [("invalid", "ann", "Invalid action."),
                            ("search", "<search> mill </search>", "The mill is old."),
                            ("answer", "<answer> Bergen </answer>", "")], "Bergen"),
        trajectory(tok, 2, [("answer", "<answer> Oslo </answer>", "")], "Oslo"),
    ]  # fmt: skip


@pytest.mark.slow
def test_mu_scores_each_step_as_its_head_does_on_the_rows_and_stays_frozen(tiny_world, mu_folder):
    folder, over = mu_folder
    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    trajs = batch(tok)
    scorer = RubricSteps(folder=str(folder), config=str(CONFIG), overrides=over)
    scores = scorer(groups_of(trajs), RewardContext(tokenizer=tok))
    assert [len(s) for s in scores] == [2, 3, 1]  # one score per agent step
    model, mu_tok, _ = scorer._mu
    assert not model.training
    # the same rows by hand: the episodes' rubric items with the criteria μ wrote, one padded
    # forward of the rubric adapter (not the shared-trunk path the scorer takes), s_t = mean d
    cfg = scorer.cfg
    items = make_rubric_items(
        cfg, [episode_from_trajectory(t, tok, cfg.env.max_searches) for t in trajs], mu_tok
    )
    written = {(it.traj, it.step): it for it in items}
    assert len(written) == 6 and scorer.last_metrics["steps"] == 6.0
    # μ's greedy criteria for each row, generated again here: the scorer's are the same ids
    from arco.rubrics import write_criteria

    write_criteria(scorer._mu[2], items, cfg.rubric.k, cfg.rubric.max_new_tokens, tok.eos_token_id)
    ids, attn, _ = rubric_batch(items, mu_tok.pad_token_id, torch.device("cpu"))
    with torch.no_grad():
        _, d = model("rubric", ids, attn, pool_mask=attn)
    by_hand = [[0.0] * len(s) for s in scores]
    for it, row in zip(items, d.tolist(), strict=True):
        by_hand[it.traj][it.step] = sum(row) / len(row)
    for got, want in zip(scores, by_hand, strict=True):
        assert got == pytest.approx(want, abs=1e-5)
    assert all(-1.0 <= s <= 1.0 for row in scores for s in row)
    valid = sum(it.criteria is not None for it in items) / len(items)
    assert scorer.last_metrics["criteria_valid_rate"] == pytest.approx(valid)
    assert scorer.last_metrics["mean_score"] == pytest.approx(sum(map(sum, by_hand)) / 6, abs=1e-5)
    # no trajectories: nothing to score, nothing loaded again
    assert scorer([], RewardContext(tokenizer=tok)) == [] and scorer._mu[0] is model


@pytest.mark.slow
def test_the_budget_mu_reads_is_the_agent_s_when_given(tiny_world, mu_folder):
    """``max_searches`` sets the budget of μ's prompts (the config's 4 by default): the rows
    differ and so, for a random head, do the scores."""
    folder, over = mu_folder
    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    ctx = RewardContext(tokenizer=tok)
    trajs = batch(tok)[:1]
    four = RubricSteps(folder=str(folder), config=str(CONFIG), overrides=over)
    two = RubricSteps(folder=str(folder), config=str(CONFIG), overrides=over, max_searches=2)
    assert four(groups_of(trajs), ctx)[0] != two(groups_of(trajs), ctx)[0]


def test_bad_settings_are_one_line_naming_the_key(tiny_world, mu_folder, tmp_path):
    folder, over = mu_folder
    args = {"folder": str(folder), "config": str(CONFIG), "overrides": over}
    spec = "arco.step_scorer:RubricSteps"
    got = load_part(spec, "reward.step_scorer", "step scorer", {}, args)
    assert isinstance(got, RubricSteps) and got._mu is None  # nothing loaded until called
    with pytest.raises(ValueError, match=r"reward.step_scorer='arco.step_scorer:RubricSteps': .*"
                       r"missing\.json|reward.step_scorer=.*missing"):  # fmt: skip
        load_part(spec, "reward.step_scorer", "step scorer", {},
                  {**args, "folder": str(tmp_path / "missing")})  # fmt: skip
    with pytest.raises(ValueError, match=r"does not take the arguments \['fodler'\]"):
        load_part(spec, "reward.step_scorer", "step scorer", {}, {"fodler": str(folder)})
    with pytest.raises(ValueError, match=r"its head gives 3 scores a step.*needs 1"):
        RubricSteps(folder=str(folder), config=str(CONFIG), overrides=[*over, "rubric.k=1"])


@pytest.mark.slow
def test_the_search_grpo_loop_trains_on_mu_s_dense_advantages(tiny_world, mu_folder, tmp_path):
    from common.search_grpo import GRPOConfig, train_grpo
    from common.train import read_metrics

    folder, over = mu_folder
    run_dir = tmp_path / "run"
    args = json.dumps({"folder": str(folder), "config": str(CONFIG), "overrides": over})
    cli = [
        f"assets.world={tiny_world}", f"assets.model={tiny_world / 'model'}", f"run_dir={run_dir}", "steps=1",
        "questions_per_step=2", "n=4", "eval_every=0", "loss.micro_batch_size=4",
        "engine.backend=hf", "reward.advantage=arco.advantages:DenseAdvantages",
        "reward.step_scorer=arco.step_scorer:RubricSteps", f"reward.step_scorer_args={args}",
    ]  # fmt: skip
    train_grpo(load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml", cli))
    (row,) = read_metrics(run_dir / "metrics.jsonl")
    samples = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert row["step_scorer/steps"] >= 8  # every one of the 8 trajectories has a step
    assert 0.0 <= row["step_scorer/criteria_valid_rate"] <= 1.0
    assert -1.0 <= row["step_scorer/mean_score"] <= 1.0 and row["time/step_scorer"] > 0
    assert len(samples) > 0
