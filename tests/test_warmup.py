"""The warmup's loss: the agent's tokens, plus an optional LM term on the context."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from common.rl import forward_logprobs
from common.rollout.batch import collate
from common.rollout.trajectory import Trajectory
from common.warmup import sft_loss


def _trajectories() -> list[Trajectory]:
    a = Trajectory("a", 0, "qa", "q", ["x"], [5, 6, 7])
    a.append([8, 9], sampled=True, logprobs=[0.0, 0.0])
    a.append([10, 11, 12], sampled=False)
    a.append([13], sampled=True, logprobs=[0.0])
    b = Trajectory("b", 0, "qb", "q", ["x"], [5, 6])
    b.append([20], sampled=True, logprobs=[0.0])
    return [a, b]


def test_context_weight_adds_the_lm_loss_of_every_other_real_token(tiny_world):
    model = AutoModelForCausalLM.from_pretrained(tiny_world / "model", dtype=torch.float32)
    batch = collate(_trajectories(), pad_id=0)
    with torch.no_grad():
        logp = forward_logprobs(model, batch.input_ids, batch.attention_mask)
        # by hand: a's targets are 6 7 | 8 9 | 10 11 12 | 13 (own: 8 9 13); b's 6 | 20 (own: 20)
        own = [logp[0, 2], logp[0, 3], logp[0, 7], logp[1, 1]]
        other = [logp[0, 0], logp[0, 1], logp[0, 4], logp[0, 5], logp[0, 6], logp[1, 0]]
        own_nll = -torch.stack(own).mean()
        other_nll = -torch.stack(other).mean()
        loss0, nll0 = sft_loss(model, batch)
        loss1, nll1 = sft_loss(model, batch, context_weight=0.5)
    assert loss0.item() == pytest.approx(own_nll.item(), rel=1e-6)
    assert nll0.item() == nll1.item() == pytest.approx(own_nll.item(), rel=1e-6)
    assert loss1.item() == pytest.approx((own_nll + 0.5 * other_nll).item(), rel=1e-6)


def test_weak_teacher_answers_the_first_hop_of_the_chosen_bridge_questions(tiny_world):
    from transformers import AutoTokenizer

    from common.data import load_qa
    from common.retrieval.bm25 import BM25Retriever
    from common.rollout.agent import AgentConfig
    from common.warmup import gold_trajectories

    examples = load_qa(tiny_world / "train.jsonl")[:40]
    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "model")
    retriever = BM25Retriever.from_corpus(tiny_world / "corpus.jsonl")
    cfg = AgentConfig(instruction="Question: {question}\n", max_obs_tokens=64)
    gold = gold_trajectories(examples, tokenizer, retriever, cfg)
    weak = gold_trajectories(examples, tokenizer, retriever, cfg, shortcut_rate=0.5, seed=3)
    again = gold_trajectories(examples, tokenizer, retriever, cfg, shortcut_rate=0.5, seed=3)
    bridges = [i for i, ex in enumerate(examples) if ex.metadata["type"] == "bridge"]
    assert len(bridges) >= 8
    short = []
    for i, (ex, g, w) in enumerate(zip(examples, gold, weak, strict=True)):
        queries = ex.metadata["gold_queries"]
        assert g.answer == ex.golden_answers[0] and g.num_searches == len(queries)
        if w.num_searches < len(queries):  # the shortcut: one search, then the bridge entity
            short.append(i)
            assert (w.num_searches, w.answer) == (1, queries[1])
            assert [s.query for s in w.steps if s.kind == "search"] == queries[:1]
            cut = g.steps[1].start  # the same first search and documents, then the answer
            assert w.steps[-1].start == cut and w.response_ids[:cut] == g.response_ids[:cut]
        else:
            assert w.response_ids == g.response_ids
    assert set(short) <= set(bridges)
    assert 0.2 * len(bridges) <= len(short) <= 0.8 * len(bridges)
    assert [t.response_ids for t in again] == [
        t.response_ids for t in weak
    ]  # the seed fixes the choice
    every = gold_trajectories(examples, tokenizer, retriever, cfg, shortcut_rate=1.0)
    assert [i for i, t in enumerate(every) if t.num_searches == 1 < gold[i].num_searches] == bridges


def test_real_hotpotqa_questions_get_their_supporting_titles_as_the_gold_path(tiny_world):
    """HotpotQA has no ``gold_queries``: the teacher searches each supporting title, in the data's
    order; the gold answer closes the trajectory (``common/configs/warmup_smol.yaml``). A title
    is a good query, not a perfect one: over these questions' own 60 paragraphs BM25 ranks 11 of
    the 12 titled paragraphs in the top 3 ("Tom Clancy" loses to three "Tom Clancy's Net Force
    Explorers" books); 142 of 150 trajectories of the smol train split find both."""
    from transformers import AutoTokenizer

    from common.data import load_qa
    from common.retrieval.base import Doc
    from common.retrieval.bm25 import BM25Retriever
    from common.rollout.agent import AgentConfig
    from common.smol import data
    from common.warmup import gold_path, gold_trajectories

    rows = data.rows()[:6]  # the project's HotpotQA sample (common/smol/README.md)
    examples = load_qa(rows, source="hotpotqa")
    docs = [
        Doc(f"{i}.{j}", p["title"], p["text"], 0.0)
        for i, ex in enumerate(examples)
        for j, p in enumerate(ex.metadata["paragraphs"])
    ]
    retriever = BM25Retriever.from_docs(docs)
    tokenizer = AutoTokenizer.from_pretrained(tiny_world / "model")
    trajs = gold_trajectories(examples, tokenizer, retriever, AgentConfig(max_obs_tokens=64))
    assert len(trajs) == len(examples)
    found: list[bool] = []
    for row, ex, t in zip(rows, examples, trajs, strict=True):
        titles = list(dict.fromkeys(title for title, _ in row["supporting_facts"]))
        assert gold_path(ex) == titles and len(titles) == 2
        searches = [s for s in t.steps if s.kind == "search"]
        assert [s.query for s in searches] == titles
        found += [s.query in [d.title for d in s.docs] for s in searches]
        assert t.answer == row["answer"] and t.done and t.num_searches == 2
    assert sum(found) == 11 and len(found) == 12


def test_gold_path_prefers_the_worlds_queries_and_is_empty_without_either():
    from common.data import QAExample
    from common.warmup import gold_path

    both = {"gold_queries": ["a", "b"], "supporting_titles": ["T1", "T2"]}
    assert gold_path(QAExample("1", "q", ["x"], both)) == ["a", "b"]
    assert gold_path(QAExample("2", "q", ["x"], {"supporting_titles": ["T1"]})) == ["T1"]
    assert gold_path(QAExample("3", "q", ["x"], {})) == []


def test_a_missing_smol_input_names_the_key_and_says_how_to_make_it(tmp_path, tiny_world):
    from common.warmup import WarmupConfig, main, warmup_paths

    cfg = WarmupConfig(world=str(tiny_world), model=str(tmp_path / "none"), out=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"model .*none does not exist: .*make smol"):
        warmup_paths(cfg)
    paths = warmup_paths(WarmupConfig(world=str(tiny_world)))
    assert paths["train_data"] == tiny_world / "train.jsonl"
    assert main([f"world={tmp_path}", f"out={tmp_path / 'w'}"]) == 2  # one line, exit 2
    assert not (tmp_path / "w").exists()  # refused before the run folder opens


def test_a_short_warmup_writes_the_model_its_config_and_loss_log(tmp_path, tiny_world):
    """``run_warmup`` through the shared ``sft_and_save``: the derived train keys set from the
    warmup's own, ``out/model`` loadable, the loss logged every ``log_every`` (50) steps."""
    import json

    from common.warmup import WarmupConfig, run_warmup

    cfg = WarmupConfig(world=str(tiny_world), out=str(tmp_path), steps=2, batch_size=2, seed=3)
    assert run_warmup(cfg) == tmp_path / "model"
    assert (cfg.train.total_steps, cfg.train.seed) == (2, 3)  # WarmupConfig.DERIVED
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "model").num_parameters() > 0
    assert json.loads((tmp_path / "sft_loss.json").read_text()) == []  # 2 steps < 50
    assert "steps: 2" in (tmp_path / "config.yaml").read_text()
