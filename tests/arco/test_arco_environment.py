"""ARCO's environments (arco/environment.py) on real HotpotQA distractor questions.

The 8 questions of tests/data/retrieval/hotpotqa_distractor_sample.jsonl are played by a scripted
policy (``ScriptedEngine``): search each supporting paragraph's title, take an invalid action,
then on the forced-finish turn either answer the gold answer or search once more.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_distractor_env import ScriptedEngine

from arco.environment import EnvironmentConfig, build_environment
from arco.steps import episode_from_trajectory
from common.data import load_qa
from common.retrieval import HTTPRetriever, PerQuestionRetriever
from common.retrieval.bm25 import BM25Retriever
from common.rollout.agent import AgentConfig, build_prompt_ids, encode_text, run_agent
from common.rollout.protocols import get_protocol
from common.tinyworld.tokenizer import build_tokenizer

DATA = Path(__file__).parent.parent / "data"
REACT = get_protocol("react")
BASE = AgentConfig(
    protocol="search_r1", max_turns=9, topk=5, max_turn_tokens=128, max_obs_tokens=1024,
    max_context=8192, temperature=0.0,
)  # fmt: skip


@pytest.fixture(scope="module")
def examples():
    return load_qa(DATA / "retrieval" / "hotpotqa_distractor_sample.jsonl")


@pytest.fixture(scope="module")
def tok(examples):
    texts = [p["text"] for ex in examples for p in ex.metadata["paragraphs"]]
    return build_tokenizer([*texts, REACT.user_prompt("?")], vocab_size=1024)


def test_distractor_setting_builds_per_question_react_top1_without_titles():
    retriever, agent = build_environment(EnvironmentConfig(setting="distractor"), BASE)
    assert isinstance(retriever, PerQuestionRetriever)
    assert (agent.protocol, agent.topk, agent.obs_titles, agent.max_turns) == ("react", 1, False, 3)
    assert (agent.max_turn_tokens, agent.temperature) == (128, 0.0)  # the rest is the base's
    assert BASE.max_turns == 9  # not changed in place


def test_open_setting_uses_a_corpus_retriever_and_the_configured_protocol():
    corpus = str(DATA / "retrieval" / "wiki18_sample_corpus.jsonl")
    cfg = EnvironmentConfig(setting="open", protocol="search_r1", topk=2)
    retriever, agent = build_environment(cfg, BASE, corpus=corpus)
    assert isinstance(retriever, BM25Retriever) and len(retriever) == 10
    assert (agent.protocol, agent.topk, agent.obs_titles, agent.max_turns) == (
        "search_r1", 2, True, 3,
    )  # fmt: skip
    retriever, _ = build_environment(cfg, BASE, corpus, retrieval_url="http://127.0.0.1:8000")
    assert isinstance(retriever, HTTPRetriever)
    assert retriever.url == "http://127.0.0.1:8000/retrieve"
    with pytest.raises(ValueError, match="needs assets.corpus or assets.retrieval_url"):
        build_environment(EnvironmentConfig(), BASE)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"setting": "closed"}, "env.setting 'closed'"),
        ({"max_searches": 0}, "env.max_searches must be >= 1"),
        ({"protocol": "toolformer"}, "env.protocol 'toolformer'"),
    ],
)
def test_bad_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EnvironmentConfig(**kwargs)


def test_distractor_episodes_on_real_questions(examples, tok):
    """Search both supporting titles, an invalid action, then the forced-finish turn: the gold
    answer (R = 1) for even rows, a search (not run; no answer, R = 0) for odd ones."""
    cfg = EnvironmentConfig(setting="distractor", max_searches=3)
    retriever, agent = build_environment(cfg, BASE)
    turns = {}
    for i, ex in enumerate(examples):
        first, second = ex.metadata["supporting_titles"]
        last = f"Finish[{ex.golden_answers[0]}]" if i % 2 == 0 else f"Search[{first}]"
        turns[ex.question] = [
            f"Thought: I look up {first} first.\nSearch[{first}]",
            f"Search[{second}]",
            f"Lookup[{second}]",
            last,
        ]
    engine = ScriptedEngine(tok, REACT, turns)
    trajs = run_agent(engine, tok, retriever, examples, 1, agent)

    invalid = encode_text(tok, REACT.invalid_message())
    force = encode_text(tok, REACT.force_answer_message())
    for i, (ex, t) in enumerate(zip(examples, trajs, strict=True)):
        paragraphs = ex.metadata["paragraphs"]
        titles = [p["title"] for p in paragraphs]
        assert len(paragraphs) == 10
        # both searches: the supporting paragraph ranks first among the question's 10, and the
        # observation is its text alone
        for s, title in zip(t.steps[:2], ex.metadata["supporting_titles"], strict=True):
            assert s.kind == "search" and s.query == title  # "Black Book (film)" kept whole
            (doc,) = s.docs
            assert (doc.title, doc.id) == (title, str(titles.index(title)))
            text = paragraphs[titles.index(title)]["text"]
            assert doc.text == text
            nxt = t.steps[t.steps.index(s) + 1].start
            assert tok.decode(t.response_ids[s.end : nxt]) == f"\nObservation: {text}\nThought:"
        # the invalid action costs the third unit and is explained; then the forced turn
        third, forced = t.steps[2], t.steps[3]
        assert third.kind == "invalid" and not third.forced
        assert t.response_ids[third.end : forced.start] == invalid + force
        assert forced.forced and len(t.steps) == cfg.max_searches + 1
        assert t.num_searches == 2 and t.num_invalid == 1 + (i % 2)
        episode = episode_from_trajectory(t, tok, cfg.max_searches)
        if i % 2 == 0:
            assert (forced.kind, t.answer, episode.reward) == ("answer", ex.golden_answers[0], 1.0)
        else:  # a search when none remain: not run, the episode ends unanswered
            assert (forced.kind, forced.docs, t.answer) == ("invalid", [], None)
            assert t.forced_terminated and episode.reward == 0.0
    assert {ex.golden_answers[0] for ex in examples} >= {"yes", "Dutch"}
    # one engine call per turn, all questions together; the prompt is ReAct's
    assert len(engine.calls) == 4 and all(len(p) == 8 for p, _ in engine.calls)
    assert trajs[0].prompt_ids == build_prompt_ids(tok, REACT, examples[0].question)
