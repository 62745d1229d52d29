"""DenseRetriever on a tiny BERT encoder and tokenizer built here (random weights)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import BertConfig, BertModel, BertTokenizerFast

from common.retrieval import Doc, build_index, doc_contents, load_index, read_corpus
from common.retrieval.dense import DenseRetriever, Encoder, make_index

faiss = pytest.importorskip("faiss")

DATA = Path(__file__).parent / "data" / "retrieval"
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def corpus_docs() -> list[Doc]:
    """The 10 Wikipedia-2018 rows and the HotpotQA sample's first 90 paragraphs."""
    docs = read_corpus(DATA / "wiki18_sample_corpus.jsonl")
    for line in (DATA / "hotpotqa_sample.jsonl").open():
        for title, sentences in json.loads(line)["context"]:
            docs.append(Doc(f"h{len(docs)}", title, "".join(sentences), 0.0))
    return docs[:100]


@pytest.fixture(scope="module", autouse=True)
def one_faiss_thread():
    # faiss's OpenMP threads spin-wait; on a small, shared CI machine k-means training then
    # runs hundreds of times slower than on one thread.
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return corpus_docs()


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, docs) -> Path:
    """A 2-layer BERT (hidden 32) with a WordPiece tokenizer trained on the test corpus."""
    path = tmp_path_factory.mktemp("tiny_bert")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        [doc_contents(d) for d in docs],
        trainers.WordPieceTrainer(vocab_size=800, special_tokens=SPECIAL),
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    tokenizer = BertTokenizerFast(
        tokenizer_object=tok,
        **{
            k: v
            for k, v in zip(
                ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                SPECIAL,
                strict=True,
            )
        },
    )
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=256,
    )
    BertModel(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def encoder(encoder_dir) -> Encoder:
    # No prefixes: a passage queried with its own contents must then embed identically.
    return Encoder(encoder_dir, query_prefix="", passage_prefix="", max_length=128, batch_size=16)


@pytest.fixture(scope="module")
def flat(docs, encoder) -> DenseRetriever:
    return DenseRetriever.build(docs, encoder, "flat")


def test_embeddings_are_unit_mean_pooled_and_prefixed(encoder_dir):
    enc = Encoder(encoder_dir, max_length=64)
    emb = enc.encode_queries(["who founded moscow state university", "x"])
    assert emb.shape == (2, 32) and emb.dtype == np.float32
    assert np.linalg.norm(emb, axis=1) == pytest.approx([1.0, 1.0], abs=1e-6)
    assert np.array_equal(emb[:1], enc.encode(["query: who founded moscow state university"], ""))
    # Mean pooling by hand: the average of the last hidden states over all tokens.
    inputs = enc.tokenizer(["query: x"], return_tensors="pt")
    with torch.no_grad():
        mean = enc.model(**inputs).last_hidden_state[0].mean(0)
    assert emb[1] == pytest.approx((mean / mean.norm()).numpy(), abs=1e-6)


def test_flat_index_finds_each_passage_by_its_own_text(docs, flat):
    results = flat.search([doc_contents(d) for d in docs], 3)
    assert [r[0].id for r in results] == [d.id for d in docs]
    assert all(r[0].score == pytest.approx(1.0, abs=1e-5) for r in results)
    assert all(r[0].score >= r[1].score >= r[2].score for r in results)
    assert results[0][0] == Doc(docs[0].id, docs[0].title, docs[0].text, results[0][0].score)


def test_k_is_clamped_and_validated(docs, flat):
    assert len(flat.search(["anything"], 1000)[0]) == len(docs)
    assert flat.search([], 5) == []
    with pytest.raises(ValueError, match="k must be at least 1"):
        flat.search(["q"], 0)


@pytest.mark.parametrize("mmap", [True, False])
def test_flat_save_load_round_trip(docs, flat, encoder_dir, tmp_path, mmap):
    flat.save(tmp_path / "idx")
    loaded = load_index(tmp_path / "idx", mmap=mmap)
    assert isinstance(loaded, DenseRetriever) and len(loaded) == len(docs)
    queries = ["Moscow State University", docs[5].text[:80], "Black Book film"]
    assert loaded.search(queries, 4) == flat.search(queries, 4)


@pytest.mark.parametrize("index_type", ["pq", "ivfpq"])
def test_compressed_indexes_build_search_and_round_trip(docs, encoder, tmp_path, index_type):
    retriever = DenseRetriever.build(docs, encoder, index_type, pq_m=8)
    index = retriever.index
    assert index.ntotal == len(docs) and index.pq.M == 8
    assert index.pq.nbits == 6  # 100 training vectors: at most 2^6 centroids per subspace
    if index_type == "ivfpq":
        assert index.nlist == 2 and index.nprobe == 2  # 100 // 39 lists, all probed
    queries = [doc_contents(d) for d in docs]
    results = retriever.search(queries, 5)
    self_in_top5 = np.mean(
        [d.id in {r.id for r in row} for d, row in zip(docs, results, strict=True)]
    )
    assert self_in_top5 >= 0.5  # lossy codes, yet far above chance (5%)
    retriever.save(tmp_path / index_type)
    assert DenseRetriever.load(tmp_path / index_type).search(queries[:10], 5) == results[:10]


def test_index_file_bytes_per_vector(tmp_path):
    """Each added vector grows a flat file by 4 * dim bytes and a PQ file by m bytes."""
    x = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    for index_type, per_vector in (("flat", 256), ("pq", 16)):
        index = make_index(64, index_type, x, pq_m=16)
        sizes = []
        for chunk in (x[:500], x[500:]):
            index.add(chunk)
            faiss.write_index(index, str(tmp_path / "i"))
            sizes.append((tmp_path / "i").stat().st_size)
        assert (sizes[1] - sizes[0]) / 500 == per_vector


def test_bad_index_settings_are_named():
    x = np.zeros((10, 32), dtype=np.float32)
    with pytest.raises(ValueError, match="index_type must be one of"):
        make_index(32, "hnsw", x)
    with pytest.raises(ValueError, match="pq_m=5 must divide the embedding dimension 32"):
        make_index(32, "pq", x, pq_m=5)


def test_build_index_with_dense_encoder(encoder_dir, tmp_path):
    """What `python -m common.retrieval index --dense-encoder DIR` runs."""
    corpus = DATA / "wiki18_sample_corpus.jsonl"
    built = build_index(corpus, tmp_path / "idx", dense_encoder=encoder_dir, batch_size=4)
    loaded = load_index(tmp_path / "idx")
    assert isinstance(loaded, DenseRetriever) and len(loaded) == 10
    assert loaded.encoder.query_prefix == "query: " and loaded.encoder.passage_prefix == "passage: "
    assert loaded.search(["Horatio Hale"], 10) == built.search(["Horatio Hale"], 10)
