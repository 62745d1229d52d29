"""Long work shows progress: evaluation and E2E-APE write a bar to stderr (rank 0, the
project's ``progress``: counts and a rate; in a log file its first and last state), and their
results (return values, stdout, files) are what they were."""

from __future__ import annotations

import re

import pytest
import torch

from common.data import load_qa
from common.retrieval.bm25 import BM25Retriever
from common.rl_loop import evaluate
from common.rollout import AgentConfig, HFEngine
from common.train import progress


def test_a_counting_bar_writes_counts_and_a_rate_to_stderr(capsys):
    with progress(None, "judging", total=3, unit="candidate") as bar:
        for _ in range(3):
            bar.update(1)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.search(r"judging: 100%.*3/3 \[.*(candidate/s|s/candidate)", captured.err)


@pytest.fixture(scope="module")
def world_agent(tiny_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_world / "model")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_world / "model", dtype=torch.float32)
    retriever = BM25Retriever.from_corpus(tiny_world / "corpus.jsonl")
    agent = AgentConfig(max_turns=2, max_turn_tokens=6, max_obs_tokens=24, temperature=0.0)
    return HFEngine(model, tok), tok, retriever, agent


def test_search_agent_evaluation_counts_its_questions_on_stderr(tiny_world, world_agent, capsys):
    engine, tok, retriever, agent = world_agent
    examples = load_qa(tiny_world / "dev.jsonl")[:3]
    with_bar = evaluate(engine, tok, retriever, examples, agent, desc="dev eval")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert re.search(r"dev eval: 100%.*3/3 \[.*(question/s|s/question)", captured.err)
    quiet = evaluate(engine, tok, retriever, examples, agent, desc=None)
    assert capsys.readouterr().err == ""
    assert with_bar == quiet  # greedy: the same metrics, bar or not
