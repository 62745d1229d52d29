"""cer.rewards.search_agent: CER as the search agent's reward. On hand-built search trajectories (Qwen3's
tokenizer, a random tiny Qwen3), the rewards equal a from-scratch computation: every prefix +
continuation forwarded whole, the continuation's log-probabilities summed, R_k by its formula."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from cer.rewards.search_agent import AgentCER, agent_split
from common.config import load_config
from common.rewards import Group, RewardContext, groups_of, load_part
from common.rollout.trajectory import Step, Trajectory
from common.search_grpo import GRPOConfig

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
OBS = "\n\n<information>Doc 1 (Title: France) Paris is the capital of France.\n</information>\n\n"


@pytest.fixture(scope="module")
def model(qwen3_tokenizer) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=len(qwen3_tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3ForCausalLM(config).eval()


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def traj(tok, k: int, parts: list[tuple[str, str | None]], answer: str | None) -> Trajectory:
    """Parts in order: (text, step kind) for a sampled turn, (text, None) for inserted text."""
    t = Trajectory("g", k, "q", "What is the capital of France?", ["Paris"], enc(tok, PROMPT))
    for text, kind in parts:
        ids = enc(tok, text)
        start = len(t.response_ids)
        t.append(ids, sampled=kind is not None, logprobs=[0.0] * len(ids) if kind else None)
        if kind:
            t.steps.append(Step(kind, start, len(t.response_ids)))
    t.answer, t.done = answer, True
    return t


def trajectories(tok) -> tuple[list[Trajectory], list[tuple[list[int], str, str]]]:
    """Four trajectories, and for each the prefix, tail and closing it must be scored with."""
    search = "<think>look it up</think>\n<search> France capital </search>"
    ts = [
        traj(tok, 0, [(search, "search"), (OBS, None), ("<answer> Paris </answer>", "answer")],
             "Paris"),
        traj(tok, 1, [("<answer> Rome </answer>", "answer")], "Rome"),
        # the answer's last character merges with the closing tag: '.</'
        traj(tok, 2, [("<answer> U.S.</answer>", "answer")], "U.S."),
        # no answer, the turn ended by the end-of-turn token
        traj(tok, 3, [("I do not know<|im_end|>", "invalid")], None),
    ]  # fmt: skip
    p = enc(tok, PROMPT)
    expected = [
        # ' Paris' straddles the answer's start: the prefix stops after '>', tail ' '
        (p + enc(tok, search) + enc(tok, OBS) + enc(tok, "<answer>"), " ", " </answer>"),
        (p + enc(tok, "<answer>"), " ", " </answer>"),
        (p + enc(tok, "<answer>"), " ", "</answer>"),
        (p + enc(tok, "I do not know"), "<answer> ", " </answer>"),
    ]
    return ts, expected


def starting_with(tok, text: str) -> list[int]:
    """Every token whose text starts with ``text`` (byte-level: ASCII stands for itself)."""
    return [i for i, s in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))) if
            s is not None and s.startswith(text) and not s.startswith("<|")]  # fmt: skip


def from_scratch(model, tok, prefix: list[int], cont: list[int], alternatives: list[int]) -> float:
    """log pi(cont | prefix): the whole sequence forwarded once, the last step summed over the
    tokens that start with its token's text when that token ends the closing tag."""
    with torch.no_grad():
        logits = model(torch.tensor([prefix + cont])).logits[0].double()
    logp = torch.log_softmax(logits, -1)
    rows = [logp[len(prefix) - 1 + i] for i in range(len(cont))]
    total = sum(row[c].item() for row, c in zip(rows[:-1], cont[:-1], strict=True))
    if tok.decode([cont[-1]]) == ">":
        assert cont[-1] in alternatives
        return total + torch.logsumexp(rows[-1][alternatives], 0).item()
    return total + rows[-1][cont[-1]].item()


def expected_rewards(model, tok, ts, expected, golds: list[str]) -> torch.Tensor:
    """R_k = sum_j p(a_k|s_j) p*(s_j) / sum_j p(a_k|s_j), p*(s_j) = sum over the gold forms."""
    alternatives = starting_with(tok, ">")

    def logp(j: int, x: str) -> float:
        prefix, tail, closing = expected[j]
        return from_scratch(model, tok, prefix, enc(tok, tail + x + closing), alternatives)

    ref = torch.tensor(
        [sum(torch.tensor(logp(j, g)).exp().item() for g in golds) for j in range(len(ts))],
        dtype=torch.float64,
    )
    out = []
    for t in ts:
        if t.answer is None:
            out.append(0.0)
            continue
        pk = torch.tensor([logp(j, t.answer) for j in range(len(ts))], dtype=torch.float64).exp()
        out.append(((pk * ref).sum() / pk.sum()).item())
    return torch.tensor(out, dtype=torch.float64)


def test_the_split_is_the_trajectory_s_own_ids_up_to_its_answer(qwen3_tokenizer):
    ts, expected = trajectories(qwen3_tokenizer)
    for t, (prefix, tail, closing) in zip(ts, expected, strict=True):
        split = agent_split(t, qwen3_tokenizer)
        assert (split.solution_ids, split.tail, split.closing) == (prefix, tail, closing)
        assert split.answer == t.answer
    # the answer-end boundary: the sampled '.</' token is both the answer's and the closing's
    assert qwen3_tokenizer.decode(agent_split(ts[2], qwen3_tokenizer).closing_ids[0]) == ".</"


@pytest.mark.parametrize("golds", [["Paris"], ["Paris", "paris"]])
def test_rewards_equal_a_from_scratch_computation(qwen3_tokenizer, model, golds):
    ts, expected = trajectories(qwen3_tokenizer)
    groups = groups_of(ts)
    groups[0].golden_answers = golds[:1]
    groups[0].aliases = golds[1:]
    ctx = RewardContext(policy=model, tokenizer=qwen3_tokenizer)
    out = AgentCER()(groups, ctx)
    want = expected_rewards(model, qwen3_tokenizer, ts, expected, golds)
    got = out.values.double()
    assert out.values.shape == (4,)
    assert got[3].item() == 0.0  # no answer: 0, while its trajectory still counts as an s_j
    assert (got[:3] > 0).all() and len(set(got[:3].tolist())) == 3
    # the probabilities are tiny under a random model over 151,936 tokens: relative, and 1e-5
    torch.testing.assert_close(got, want, rtol=1e-4, atol=0.0)
    assert (got - want).abs().max().item() < 1e-5
    assert set(out.metrics) == {"cer/ref_prob_mean", "cer/ref_prob_max", "cer/distinct_answers"}
    assert out.metrics["cer/distinct_answers"] == 3
    # "first" scores a* alone
    first = AgentCER(aliases="first")(groups, ctx).values.double()
    torch.testing.assert_close(
        first, expected_rewards(model, qwen3_tokenizer, ts, expected, golds[:1]), rtol=1e-4,
        atol=0.0,
    )  # fmt: skip


def test_two_groups_in_one_call_equal_each_alone(qwen3_tokenizer, model):
    ts, _ = trajectories(qwen3_tokenizer)
    other = [Trajectory(**{**t.__dict__, "group_id": "h"}) for t in ts[:2]]
    ctx = RewardContext(policy=model, tokenizer=qwen3_tokenizer)
    both = AgentCER()(groups_of(ts + other), ctx).values
    alone = [AgentCER()(groups_of(x), ctx).values for x in (ts, other)]
    torch.testing.assert_close(both, torch.cat(alone), rtol=1e-5, atol=0.0)


def test_a_training_policy_scores_in_eval_mode_and_stays_training(qwen3_tokenizer, model):
    ts, _ = trajectories(qwen3_tokenizer)
    ctx = RewardContext(policy=model, tokenizer=qwen3_tokenizer)
    want = AgentCER()(groups_of(ts), ctx).values
    model.train()
    model.gradient_checkpointing_enable()
    try:
        got = AgentCER()(groups_of(ts), ctx).values
        assert model.training
    finally:
        model.gradient_checkpointing_disable()
        model.eval()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0.0)


def test_a_group_without_any_answer_is_all_zero(qwen3_tokenizer, model):
    ts, _ = trajectories(qwen3_tokenizer)
    group = Group("q", ["Paris"], [], [ts[3], ts[3]], [None, None])
    out = AgentCER()([group], RewardContext(policy=model, tokenizer=qwen3_tokenizer))
    assert out.values.tolist() == [0.0, 0.0]
    assert out.metrics["cer/distinct_answers"] == 0


def test_the_configs_take_it_by_import_path():
    from eviback.config import EviBackConfig

    spec = "cer.rewards.search_agent:AgentCER"
    assert isinstance(load_part(spec, "reward.fn", "reward", {}), AgentCER)
    over = [f"reward.fn={spec}"]
    cfg = load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml", over)
    assert isinstance(cfg.reward.reward_fn(), AgentCER)
    evi = load_config(EviBackConfig, ROOT / "eviback/configs/tiny.yaml", over)
    assert isinstance(evi.reward.reward_fn(), AgentCER)


@pytest.mark.slow
def test_one_search_grpo_step_trains_with_it(tiny_world, tmp_path):
    from common.search_grpo import train_grpo
    from common.train import read_metrics

    run_dir = tmp_path / "run"
    over = [
        f"assets.world={tiny_world}", f"assets.model={tiny_world / 'model'}", f"run_dir={run_dir}",
        "steps=1", "questions_per_step=2", "n=4", "eval_every=0", "loss.micro_batch_size=4",
        "engine.backend=hf", "reward.fn=cer.rewards.search_agent:AgentCER",
    ]  # fmt: skip
    train_grpo(load_config(GRPOConfig, ROOT / "common/configs/grpo_tiny.yaml", over))
    (row,) = read_metrics(run_dir / "metrics.jsonl")
    samples = json.loads((run_dir / "samples" / "step_00001.json").read_text())
    assert 0.0 <= row["reward"] <= 1.0 and "cer/ref_prob_mean" in row
    assert all(s["reward"] == 0.0 for s in samples if s["answer"] is None)


def test_the_compare_spec_s_arms_build_and_the_make_target_runs_it():
    import subprocess

    import yaml

    spec = yaml.safe_load((ROOT / "common/configs/compare_grpo_cer_tiny.yaml").read_text())
    assert [a["name"] for a in spec["arms"]] == ["exact_match", "f1", "cer"]
    assert spec["seeds"] == [0, 1, 2] and spec["baseline"] == "exact_match"
    fns = []
    for arm in spec["arms"]:
        assert arm["command"][:3] == ["python", "-m", "common.search_grpo"]
        cfg = load_config(GRPOConfig, ROOT / arm["command"][-1], arm["overrides"])
        fns.append(cfg.reward.reward_fn())
    assert fns[0].__name__ == "exact_match" and fns[1].__name__ == "f1"
    assert isinstance(fns[2], AgentCER)
    dry = subprocess.run(["make", "-n", "compare-grpo-cer"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    assert "experiments.compare --spec common/configs/compare_grpo_cer_tiny.yaml" in dry
