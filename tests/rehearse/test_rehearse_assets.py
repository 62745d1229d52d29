"""Stand-in data for every paper config, read back by the project's own loaders; the stand-in
corpus and the random E5-class encoder through common.retrieval (in process and served)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from arco.config import ArcoConfig
from cer.config import CERConfig
from cer.data import load_math_examples, webinstruct_paper_filter
from common.config import config_to_dict, load_config
from common.data import load_qa
from common.retrieval.base import read_corpus
from eviback.assets import load_questions
from eviback.config import EviBackConfig
from experiments.rehearse.assets import (
    CHOICE_ANSWERS,
    MATH_ANSWERS,
    QA_ANSWERS,
    AssetsError,
    arco_data,
    cer_data,
    corpus_docs,
    cycle_rows,
    eviback_data,
    standin_corpus,
    standin_e5_encoder,
)

ROOT = Path(__file__).resolve().parents[2]
ROWS = 8


def loaded(cls, path: str) -> dict:
    return config_to_dict(load_config(cls, ROOT / path))


def overridden(cls, path: str, overrides: dict[str, str]):
    """The config with the overrides applied as a user would on the command line."""
    return load_config(cls, ROOT / path, [f"{k}={v}" for k, v in overrides.items()])


@pytest.mark.parametrize("name", ["qwen3_0.6b", "qwen3_1.7b", "qwen3_4b"])
def test_eviback_configs(name, tmp_path):
    path = f"eviback/configs/{name}.yaml"
    overrides = eviback_data(loaded(EviBackConfig, path), tmp_path, ROWS)
    sources = {
        "train": ["nq", "hotpotqa", "musique", "2wiki"],
        "dev": ["hotpotqa", "nq"],
        "eval": ["nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"],
    }
    assert set(overrides) == {f"assets.{g}.{s}" for g, ss in sources.items() for s in ss}
    a = overridden(EviBackConfig, path, overrides).assets
    for group in ("train", "eval"):
        files = getattr(a, group)
        # the release's draw: dedup by normalised question, SHA-256 rank; all 8 are distinct
        examples = load_questions(files, dict.fromkeys(files, ROWS), 42, "sha256", a.release_names)
        assert len(examples) == ROWS * len(files)
        assert all(set(ex.golden_answers) <= {*QA_ANSWERS, "Paris, France"} for ex in examples)
    hotpot = load_qa(a.train["hotpotqa"], source="hotpotqa")
    assert all(ex.metadata["supporting_titles"] for ex in hotpot)  # the oracle's labels
    musique = load_qa(a.train["musique"], source="musique")
    assert musique[0].golden_answers == ["Paris", "Paris, France"]


@pytest.mark.parametrize(
    "name, train_layout, dev_choice",
    [
        ("qwen3_4b_base_math", "math", False),
        ("qwen3_8b_base_math", "math", False),
        ("qwen3_4b_base_webinstruct", "webinstruct", True),
        ("qwen3_8b_base_webinstruct", "webinstruct", True),
    ],
)
def test_cer_configs(name, train_layout, dev_choice, tmp_path):
    path = f"cer/configs/{name}.yaml"
    overrides = cer_data(loaded(CERConfig, path), tmp_path, ROWS)
    benches = ["math500", "amc23", "aime24", "aime25", "mmlu_pro", "supergpqa"]
    assert set(overrides) == {
        "assets.train",
        "assets.dev",
        *(f"assets.eval.{b}" for b in benches),
    }
    a = overridden(CERConfig, path, overrides).assets
    train = load_math_examples(a.train, a.train_format).examples
    if train_layout == "webinstruct":
        assert len(train) == ROWS + 2 and len(webinstruct_paper_filter(train)) == ROWS
    else:
        assert len(train) == ROWS and "solution" in train[0].metadata
    assert {ex.answer for ex in train} <= set(MATH_ANSWERS)
    dev = load_math_examples(a.dev).examples
    assert {ex.answer for ex in dev} <= set(CHOICE_ANSWERS if dev_choice else MATH_ANSWERS)
    for bench, file in a.eval.items():
        examples = load_math_examples(file).examples
        choice = bench in ("mmlu_pro", "supergpqa")
        assert len(examples) == ROWS, bench
        assert {ex.answer for ex in examples} <= set(CHOICE_ANSWERS if choice else MATH_ANSWERS)
        assert all(bool(ex.metadata.get("multiple_choice")) == choice for ex in examples)
    assert len({ex.problem for ex in train}) == len(train)  # repeats are relabelled


@pytest.mark.parametrize("model", ["qwen3_4b", "llama3.2_3b"])
@pytest.mark.parametrize(
    "data, suffix", [("hotpotqa", ".json"), ("2wiki", ".json"), ("musique", ".jsonl")]
)
def test_arco_configs(model, data, suffix, tmp_path):
    path = f"arco/configs/{model}_{data}.yaml"
    overrides = arco_data(loaded(ArcoConfig, path), tmp_path, ROWS)
    assert set(overrides) == {"assets.train", "assets.dev", f"assets.eval.{data}"}
    assert all(p.endswith(suffix) for p in overrides.values())
    cfg = overridden(ArcoConfig, path, overrides)
    cfg.check_assets(("train", "dev", "eval"))
    for file in (cfg.assets.train, cfg.assets.dev, *cfg.assets.eval.values()):
        examples = load_qa(file)
        assert len(examples) == ROWS and len({ex.id for ex in examples}) == ROWS
        for ex in examples:
            assert ex.golden_answers[0] in QA_ANSWERS
            support = " ".join(
                p["text"]
                for p in ex.metadata["paragraphs"]
                if p["title"] in ex.metadata["supporting_titles"]
            )
            assert ex.golden_answers[0] in support  # the distractor setting can find it


def test_unknown_keys_are_named(tmp_path):
    with pytest.raises(AssetsError, match=r"assets\.train\.squad: no stand-in FlashRAG"):
        eviback_data({"assets": {"train": {"squad": "x.jsonl"}}}, tmp_path, 2)
    with pytest.raises(AssetsError, match=r"assets\.extra_file is not a key"):
        arco_data({"assets": {"extra_file": "x.json"}}, tmp_path, 2)
    with pytest.raises(AssetsError, match=r"assets\.eval\.gsm8k: cannot tell the data layout"):
        cer_data({"assets": {"eval": {"gsm8k": "data/gsm8k.jsonl"}}}, tmp_path, 2)
    with pytest.raises(AssetsError, match=r"assets\.eval\.nq: cannot tell"):
        arco_data({"assets": {"eval": {"nq": "data/nq.json"}}}, tmp_path, 2)
    with pytest.raises(AssetsError, match="still names defaults"):
        eviback_data({"defaults": "base.yaml", "assets": {}}, tmp_path, 2)


def test_cycle_rows_relabels_repeats():
    base = [{"id": "a", "question": "Q1?"}, {"idx": 4, "question": "Q2?"}]
    assert cycle_rows(base, 5) == [
        {"id": "a", "question": "Q1?"},
        {"idx": 4, "question": "Q2?"},
        {"id": "a-copy1", "question": "Q1? (rehearsal copy 2)"},
        {"idx": 100004, "question": "Q2? (rehearsal copy 2)"},
        {"id": "a-copy2", "question": "Q1? (rehearsal copy 3)"},
    ]
    with pytest.raises(AssetsError, match="rows must be at least 1"):
        cycle_rows(base, 0)


def test_corpus_and_config_corpus_key(tmp_path):
    path = standin_corpus(tmp_path)
    docs = read_corpus(path)
    assert len(docs) == len(corpus_docs()) and len({d.id for d in docs}) == len(docs)
    assert len(docs) >= 60  # 10 wiki18 + 3 hand-made + every sample paragraph once
    text = " ".join(d.text for d in docs)
    assert all(a in text for a in QA_ANSWERS)
    assert [d.title for d in docs[:2]] == ["Evan Morris", "Horatio Hale"]
    overrides = arco_data({"assets": {"corpus": "c.jsonl", "train": "hotpot.json"}}, tmp_path, 2)
    assert read_corpus(overrides["assets.corpus"]) == docs


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_e5_encoder_dense_index_and_server(tmp_path):
    from transformers import AutoConfig

    from common.retrieval.index_folder import build_index, load_index

    encoder_dir = standin_e5_encoder(tmp_path)
    assert AutoConfig.from_pretrained(encoder_dir).architectures == ["BertModel"]
    corpus = standin_corpus(tmp_path)
    built = build_index(corpus, tmp_path / "index", dense_encoder=encoder_dir)
    retriever = load_index(tmp_path / "index")
    assert len(retriever) == len(read_corpus(corpus))
    docs = read_corpus(corpus)
    # each passage's own embedding finds it first (the index holds the encoder's vectors)
    vectors = built.encoder.encode_passages(docs[:5])
    _, ids = built.index.search(vectors, 1)
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    hits = retriever.search(["what is the capital of france"], 5)[0]
    assert len(hits) == 5 and [h.score for h in hits] == sorted(
        (h.score for h in hits), reverse=True
    )

    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.retrieval", "serve", "--index", str(tmp_path / "index"),
         "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.time() + 90
        while True:
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/retrieve",
                    json={"queries": ["in which year did the titanic sink"], "topk": 5},
                )
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()
                time.sleep(0.2)
        assert r.status_code == 200
        served = r.json()["result"][0]
        assert len(served) == 5
        assert all(set(d) == {"id", "contents"} for d in served)  # Search-R1's documents
        assert len({d["id"] for d in served}) == 5
    finally:
        proc.terminate()
        proc.wait(timeout=10)
