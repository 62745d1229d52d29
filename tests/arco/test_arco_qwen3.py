"""ARCO's paper configs under Qwen3's real tokenizer (tests/qwen_tokenizer.py): the policy's
longest episode and μ's longest rubric prompt, with its criteria, fit the configured context.

The worst case is built, not sampled: every search returns an observation cut at the config's
``agent.max_obs_tokens`` (a paragraph of Wikipedia-2018 text, tests/data/retrieval, long enough to
be cut), every action is ``agent.max_turn_tokens`` long, and μ's prompt is the one for the last
step, whose history holds every search.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from arco.config import ArcoConfig
from arco.environment import build_environment
from arco.rubrics import rubric_items
from arco.steps import AgentStep, Episode
from common.config import load_config
from common.retrieval.base import Doc, parse_row
from common.rollout.agent import build_prompt_ids, encode_text, observation_ids
from common.rollout.protocols import get_protocol

ROOT = Path(__file__).resolve().parents[2]
# Qwen3-4B only: the Llama-3.2-3B configs have another tokenizer
PAPER_CONFIGS = sorted((ROOT / "arco" / "configs").glob("qwen3_4b_*.yaml"))


def long_document() -> Doc:
    path = ROOT / "tests" / "data" / "retrieval" / "wiki18_sample_corpus.jsonl"
    with path.open(encoding="utf-8") as f:
        docs = [parse_row(json.loads(line), f"{path}:{i}") for i, line in enumerate(f, 1)]
    return Doc("long", "", " ".join(d.text for d in docs), 0.0)  # ten passages: ~1,600 tokens


def worst_episode(tokenizer, cfg: ArcoConfig) -> Episode:
    _, agent = build_environment(cfg.env, cfg.agent)
    protocol = get_protocol(agent.protocol)
    obs_ids = observation_ids(tokenizer, protocol, [long_document()], agent.max_obs_tokens)
    assert len(obs_ids) == agent.max_obs_tokens  # cut at the limit, as the agent cuts it
    obs = tokenizer.decode(obs_ids, skip_special_tokens=True).strip()
    # an action of max_turn_tokens tokens: a query of filler words in the protocol's form
    filler = " ".join(["Jorgensen"] * agent.max_turn_tokens)
    query = tokenizer.decode(encode_text(tokenizer, filler)[: agent.max_turn_tokens - 4])
    search = protocol.format_search(query)
    steps = [
        AgentStep("search", search, obs, cfg.env.max_searches - i)
        for i in range(cfg.env.max_searches)
    ]
    steps.append(AgentStep("answer", protocol.format_answer(query), "", 0, forced=True))
    question = (
        "Which American film director, born in the same city as the founder of the studio that "
        "released the film, directed the 1994 film that won the award for best screenplay?"
    )
    return Episode("q", question, ["x"], steps, "x", 1.0)


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.stem)
def test_longest_episode_and_rubric_prompt_fit_the_context(path, qwen3_tokenizer):
    cfg = load_config(ArcoConfig, path)
    tok = qwen3_tokenizer
    _, agent = build_environment(cfg.env, cfg.agent)
    ep = worst_episode(tok, cfg)
    # the policy: prompt + every turn + every observation within its context and the engine's
    prompt = build_prompt_ids(tok, get_protocol(agent.protocol), ep.question, agent.instruction)
    turns = cfg.env.max_searches + 1  # the searches, then the (forced) answer
    longest = (
        len(prompt) + turns * agent.max_turn_tokens + cfg.env.max_searches * (agent.max_obs_tokens)
    )
    assert longest <= agent.max_context <= cfg.engine.max_model_len
    # μ: the last step's prompt (every search in its history) plus K criteria of
    # rubric.max_new_tokens, under both prefixes (the release's "after" shows one step more)
    for prefix in ("before", "after"):
        items = rubric_items(
            [ep], tok, cfg.rubric.k, prefix, cfg.rubric.max_obs_chars, **cfg.rubric.templates()
        )
        assert [it.step for it in items] == list(range(len(ep.steps)))
        last = max(len(it.prompt_ids) for it in items)
        assert last == len(items[-1].prompt_ids)  # the history only grows
        assert last > cfg.env.max_searches * (agent.max_obs_tokens - 16)  # every observation
        assert last + cfg.rubric.max_new_tokens + 1 <= cfg.engine.max_model_len
    # the chat template is Qwen3's: the prompt opens a system turn and ends on the assistant's
    assert items[-1].prompt_ids[:3] == tok.encode("<|im_start|>system\n", add_special_tokens=False)


def test_rubric_prompt_of_a_short_history_counts_its_parts(qwen3_tokenizer):
    """A one-search episode: μ's prompt for the answer step holds the observation once, and the
    "after" prefix adds exactly the step's own action line (the answer has no observation)."""
    cfg = load_config(ArcoConfig, PAPER_CONFIGS[0])
    tok = qwen3_tokenizer
    ep = worst_episode(tok, cfg)
    ep = replace(ep, steps=[ep.steps[0], ep.steps[-1]])
    before, after = (
        rubric_items([ep], tok, cfg.rubric.k, p, **cfg.rubric.templates())[-1].prompt_ids
        for p in ("before", "after")
    )
    text_before, text_after = tok.decode(before), tok.decode(after)
    assert text_before.count(ep.steps[0].observation) == 1
    assert f"Action: {ep.steps[-1].action}\n" in text_after
    assert f"Action: {ep.steps[-1].action}\n" not in text_before
