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


# --- Search-R1's own index, as downloaded (common/retrieval/search_r1_index.py) ------------------


def test_line_offsets_skip_blank_lines_and_keep_a_last_row_without_newline(tmp_path, monkeypatch):
    import common.retrieval.search_r1_index as sr1

    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"a":1}\n\n{"b":2}\n{"c":3}')
    # newlines at 7, 8 (a blank line) and 16; the file ends at 24 without one
    assert sr1.line_offsets(path, progress=False).tolist() == [0, 8, 17, 24]
    monkeypatch.setattr(sr1, "_CHUNK", 3)  # rows and blank lines across chunk borders
    assert sr1.line_offsets(path, progress=False).tolist() == [0, 8, 17, 24]
    path.write_bytes(b'{"a":1}\n{"b":2}\n\n')
    assert sr1.line_offsets(path, progress=False).tolist() == [0, 8, 16]


@pytest.fixture(scope="module")
def search_r1_folder(tmp_path_factory, docs, encoder_dir) -> Path:
    """A folder as Search-R1's download leaves it: `wiki-18.jsonl` (its rows' format: the real
    sample's 10 rows first) and `e5_Flat.index`, an IndexFlatIP of the passages' vectors
    ("passage: " prefix, as Search-R1's index was encoded), written by faiss itself."""
    folder = tmp_path_factory.mktemp("search_r1")
    rows = [{"id": d.id, "contents": doc_contents(d)} for d in docs]
    (folder / "wiki-18.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    vectors = Encoder(encoder_dir).encode_passages(docs)
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(folder / "e5_Flat.index"))
    return folder


def test_search_r1_folder_serves_what_an_index_built_here_serves(
    search_r1_folder, docs, encoder_dir
):
    from common.retrieval.search_r1_index import open_search_r1, search_r1_files

    files = search_r1_files(search_r1_folder)
    assert files == (search_r1_folder / "e5_Flat.index", search_r1_folder / "wiki-18.jsonl")
    opened = open_search_r1(*files, encoder_dir, gpu=False)
    built = DenseRetriever.build(docs, Encoder(encoder_dir), "flat")
    queries = ["Horatio Hale", "American football coach", docs[42].title]
    assert opened.search(queries, 5) == built.search(queries, 5)
    assert opened.search([docs[42].title], 1)[0][0].id == built.search([docs[42].title], 1)[0][0].id
    # the row offsets were cached beside the corpus and are reused (checked by the file's size)
    cache = search_r1_folder / "wiki-18.jsonl.offsets.npy"
    assert np.load(cache).tolist()[-1] == (search_r1_folder / "wiki-18.jsonl").stat().st_size
    assert open_search_r1(*files, encoder_dir, gpu=False).search(queries, 5) == built.search(
        queries, 5
    )


def test_a_search_r1_index_of_another_corpus_is_refused(search_r1_folder, encoder_dir, tmp_path):
    from common.retrieval.search_r1_index import open_search_r1

    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text(
        "".join((search_r1_folder / "wiki-18.jsonl").read_text().splitlines(True)[:7])
    )
    with pytest.raises(ValueError, match=r"holds 100 vectors and .* 7 rows: not the index"):
        open_search_r1(search_r1_folder / "e5_Flat.index", corpus, encoder_dir, gpu=False)


@pytest.mark.slow
def test_serve_opens_a_search_r1_folder_and_refuses_a_folder_it_does_not_know(
    search_r1_folder, encoder_dir, tmp_path, free_port
):
    """`python -m common.retrieval serve --index <Search-R1 folder>` answers /retrieve as the
    index does; a non-empty folder holding neither kind of index is one error line, and
    nothing is built into it."""
    import subprocess
    import sys

    import httpx
    from test_retrieval_server import wait_healthy

    from common.retrieval.search_r1_index import open_search_r1

    root = Path(__file__).resolve().parents[1]
    cli = [sys.executable, "-m", "common.retrieval", "serve"]
    corpus = search_r1_folder / "wiki-18.jsonl"
    stranger = tmp_path / "e5_folder"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("an index from somewhere else")
    refused = subprocess.run(
        [*cli, "--index", str(stranger), "--corpus", str(corpus), "--port", "0"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"error: {stranger}: holds neither a saved index")
    assert sorted(p.name for p in stranger.iterdir()) == ["notes.txt"]

    port = free_port()
    args = ["--index", str(search_r1_folder), "--dense-encoder", str(encoder_dir)]
    proc = subprocess.Popen([*cli, *args, "--port", str(port), "--no-faiss-gpu"], cwd=root,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        body = {"queries": ["Horatio Hale"], "topk": 3, "return_scores": True}
        got = httpx.post(url + "/retrieve", json=body, timeout=30).json()["result"][0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    expected = open_search_r1(search_r1_folder / "e5_Flat.index", corpus, encoder_dir, gpu=False)
    want = expected.search(["Horatio Hale"], 3)[0]
    assert [hit["document"]["id"] for hit in got] == [d.id for d in want]
    assert [hit["score"] for hit in got] == pytest.approx([d.score for d in want], abs=1e-5)


def test_make_data_index_joins_and_unzips_search_r1s_download_into_a_folder_serve_opens(
    search_r1_folder, encoder_dir, tmp_path, capsys
):
    """`make data-index`: the index in two parts and the gzipped corpus, in the hub's layout
    (a stand-in), become the folder Search-R1's download script leaves, byte for byte; the parts
    are removed; a second run (the hub gone) makes nothing."""
    import gzip
    import shutil

    from common.retrieval.search_r1_index import open_search_r1, search_r1_files
    from experiments.prepare_data import FolderHub, prepare_search_r1_index

    hub = tmp_path / "hub"
    index = (search_r1_folder / "e5_Flat.index").read_bytes()
    corpus = (search_r1_folder / "wiki-18.jsonl").read_bytes()
    (hub / "PeterJinGo/wiki-18-e5-index").mkdir(parents=True)
    (hub / "PeterJinGo/wiki-18-e5-index/part_aa").write_bytes(index[:1000])
    (hub / "PeterJinGo/wiki-18-e5-index/part_ab").write_bytes(index[1000:])
    (hub / "PeterJinGo/wiki-18-corpus").mkdir(parents=True)
    (hub / "PeterJinGo/wiki-18-corpus/wiki-18.jsonl.gz").write_bytes(gzip.compress(corpus))
    made = tmp_path / "search_r1"
    assert prepare_search_r1_index(made, FolderHub(hub)) == 0
    assert (made / "e5_Flat.index").read_bytes() == index
    assert (made / "wiki-18.jsonl").read_bytes() == corpus
    assert sorted(p.name for p in made.iterdir()) == ["e5_Flat.index", "wiki-18.jsonl"]
    queries = ["Horatio Hale", "American football coach"]
    opened = open_search_r1(*search_r1_files(made), encoder_dir, gpu=False)
    original = open_search_r1(*search_r1_files(search_r1_folder), encoder_dir, gpu=False)
    assert opened.search(queries, 5) == original.search(queries, 5)
    shutil.rmtree(hub)
    capsys.readouterr()
    assert prepare_search_r1_index(made, FolderHub(hub)) == 0
    assert "2 file(s) there, 0 to make" in capsys.readouterr().out
