"""The paper configs' budgets under Qwen3's real tokenizer (tests/qwen_tokenizer.py): the actor's
prompt against the 12,000-token prompt budget, and five Wikipedia-2018 passages against the
observation limit (tests/data/retrieval/wiki18_sample_corpus.jsonl, Search-R1's sample of the
corpus; see tests/data/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from common.config import load_config
from common.retrieval.base import parse_row
from common.rollout.agent import build_prompt_ids, observation
from common.rollout.protocols import get_protocol
from eviback.config import EviBackConfig

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "eviback" / "configs"
SEARCH_R1 = get_protocol("search_r1")


def wiki_passages() -> list:
    path = ROOT / "tests" / "data" / "retrieval" / "wiki18_sample_corpus.jsonl"
    with path.open(encoding="utf-8") as f:
        return [parse_row(json.loads(line), f"{path}:{i}") for i, line in enumerate(f, 1)]


def test_five_wikipedia_passages_fit_the_paper_observation_limit(qwen3_tokenizer):
    """All 6 windows of 5 consecutive passages (and the 5 longest) are seen whole under the
    paper configs' 1,024 tokens; Search-R1's 500 cut the fourth or fifth document."""
    paper = load_config(EviBackConfig, CONFIGS / "qwen3_1.7b.yaml").agent
    old = load_config(EviBackConfig, CONFIGS / "search_r1_values.yaml").agent
    docs = wiki_passages()
    assert len(docs) == 10 and all(len(d.text.split()) == 100 for d in docs)
    longest = sorted(docs, key=lambda d: -len(qwen3_tokenizer.encode(d.text)))[:5]
    for five in [docs[i : i + 5] for i in range(6)] + [longest]:
        ids, seen = observation(qwen3_tokenizer, SEARCH_R1, five, paper.max_obs_tokens)
        assert seen == five and 700 < len(ids) <= paper.max_obs_tokens
        ids, seen = observation(qwen3_tokenizer, SEARCH_R1, five, old.max_obs_tokens)
        assert len(ids) == old.max_obs_tokens and 3 <= len(seen) <= 4
        assert seen[:-1] == five[: len(seen) - 1]
        assert five[len(seen) - 1].text.startswith(seen[-1].text)


def test_actor_prompt_fits_the_prompt_budget(qwen3_tokenizer):
    """Search-R1's instruction with a long multi-hop question: a few hundred tokens of the
    12,000-token prompt budget (max_context - max_response_tokens)."""
    agent = load_config(EviBackConfig, CONFIGS / "qwen3_1.7b.yaml").agent
    question = (
        "Who is the president of the newly declared independent country, that established the "
        "Timor Leste Commission of Truth and Friendship, with the country containing the airport "
        "that includes Lion Air?"
    )  # a MuSiQue dev question (CC BY 4.0), from the R1-Searcher sample
    ids = build_prompt_ids(qwen3_tokenizer, SEARCH_R1, question, agent.instruction)
    assert ids[:3] == qwen3_tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    assert 100 < len(ids) < 400
    budget = agent.max_context - agent.max_response_tokens
    assert budget == 12_000 and len(ids) < budget
    # the first turn's room: the response budget holds a turn and an observation
    assert agent.max_turn_tokens + agent.max_obs_tokens <= agent.max_response_tokens
