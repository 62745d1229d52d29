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
    shutil.copytree(encoder_dir, hub / "intfloat/e5-base-v2")  # serve's query encoder
    made = tmp_path / "search_r1"
    assert prepare_search_r1_index(made, FolderHub(hub)) == 0
    assert (made / "e5_Flat.index").read_bytes() == index
    assert (made / "wiki-18.jsonl").read_bytes() == corpus
    assert sorted(p.name for p in made.iterdir()) == ["e5_Flat.index", "wiki-18.jsonl"]
    assert (
        f"[data] encoder intfloat/e5-base-v2: {hub}/intfloat/e5-base-v2" in capsys.readouterr().out
    )
    queries = ["Horatio Hale", "American football coach"]
    opened = open_search_r1(*search_r1_files(made), encoder_dir, gpu=False)
    original = open_search_r1(*search_r1_files(search_r1_folder), encoder_dir, gpu=False)
    assert opened.search(queries, 5) == original.search(queries, 5)
    shutil.rmtree(hub / "PeterJinGo")
    assert prepare_search_r1_index(made, FolderHub(hub)) == 0
    assert "2 file(s) there, 0 to make" in capsys.readouterr().out


def test_make_data_index_joins_and_unzips_the_download_where_search_r1s_script_left_it(
    search_r1_folder, encoder_dir, tmp_path, capsys
):
    """Search-R1's download.py run into the folder leaves part_aa, part_ab and wiki-18.jsonl.gz
    there: `make data-index` joins and unzips them in place, fetching nothing (the stand-in hub
    holds only the encoder), and removes them once the files are whole."""
    import gzip
    import shutil

    from experiments.prepare_data import FolderHub, prepare_search_r1_index

    index = (search_r1_folder / "e5_Flat.index").read_bytes()
    corpus = (search_r1_folder / "wiki-18.jsonl").read_bytes()
    landed = tmp_path / "search_r1"
    landed.mkdir()
    (landed / "part_aa").write_bytes(index[:777])
    (landed / "part_ab").write_bytes(index[777:])
    (landed / "wiki-18.jsonl.gz").write_bytes(gzip.compress(corpus))
    hub = tmp_path / "hub"
    shutil.copytree(encoder_dir, hub / "intfloat/e5-base-v2")
    assert prepare_search_r1_index(landed, FolderHub(hub), dry_run=True) == 0
    plan = capsys.readouterr().out
    assert f"e5_Flat.index  <- {landed}/part_aa (there, " in plan
    assert "0.0 MiB to fetch" in plan
    assert prepare_search_r1_index(landed, FolderHub(hub)) == 0
    assert (landed / "e5_Flat.index").read_bytes() == index
    assert (landed / "wiki-18.jsonl").read_bytes() == corpus
    assert sorted(p.name for p in landed.iterdir()) == ["e5_Flat.index", "wiki-18.jsonl"]
    out = capsys.readouterr().out
    assert f"[data] wrote {landed}/e5_Flat.index; removed part_aa, part_ab" in out
    assert f"[data] wrote {landed}/wiki-18.jsonl; removed wiki-18.jsonl.gz" in out


def cpu_build_reason() -> str:
    """Why ``place_index`` keeps an index on the CPU with this machine's faiss-cpu."""
    why = f"faiss {faiss.__version__} is a CPU build"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        why += f", though torch sees {gpus} GPU(s): `pip uninstall -y faiss-cpu && pip install "
        why += "faiss-cuda==1.14.1.post4`"
    return why


cpu_faiss = pytest.mark.skipif(
    hasattr(faiss, "StandardGpuResources"), reason="a GPU build of faiss: the CPU reasons differ"
)


@cpu_faiss
def test_where_an_index_searches_is_said_with_the_reason_for_the_cpu(flat, encoder_dir, tmp_path):
    """``place_index``: auto keeps the index on the CPU of a CPU build and says so (the server
    printed nothing before); on refuses in one line; off is the CPU by choice. A saved folder
    opened with the server's setting carries the same words."""
    from common.retrieval.dense import IndexPlacementError, place_index

    index = faiss.IndexFlatIP(4)
    assert place_index(index, "auto") == (index, f"the CPU ({cpu_build_reason()})")
    assert place_index(index, "off") == (index, "the CPU (--faiss-gpu off)")
    with pytest.raises(IndexPlacementError) as refused:
        place_index(index, "on")
    assert str(refused.value) == (
        f"--faiss-gpu on, but the index cannot go to a GPU: {cpu_build_reason()}"
    )
    with pytest.raises(ValueError, match=r"faiss_gpu must be one of \('auto', 'on', 'off'\)"):
        place_index(index, "gpu")
    flat.save(tmp_path / "idx")
    opened = DenseRetriever.load(tmp_path / "idx", encoder_path=encoder_dir, faiss_gpu="auto")
    assert opened.index_where == f"the CPU ({cpu_build_reason()})"
    assert DenseRetriever.load(tmp_path / "idx", encoder_path=encoder_dir).index_where == (
        "the CPU (--faiss-gpu off)"
    )


def test_an_encoder_that_cannot_load_is_one_line_saying_what_to_do(tmp_path):
    from common.retrieval.dense import EncoderMissingError

    missing = tmp_path / "e5"
    with pytest.raises(EncoderMissingError) as error:
        Encoder(str(missing))
    assert "\n" not in str(error.value)
    assert str(error.value).startswith(f"the encoder {missing} could not be loaded (")
    assert str(error.value).endswith("); no such folder: give the encoder's folder or its hub id")
    missing.mkdir()
    with pytest.raises(EncoderMissingError, match=r"; give a folder holding an encoder's config"):
        Encoder(str(missing))


@pytest.mark.slow
@cpu_faiss
def test_serve_says_where_the_index_searches_and_refuses_on_without_a_gpu(
    flat, encoder_dir, tmp_path, free_port
):
    import subprocess
    import sys

    from test_retrieval_server import wait_healthy

    root = Path(__file__).resolve().parents[1]
    folder = tmp_path / "idx"
    flat.save(folder)
    cli = [sys.executable, "-m", "common.retrieval", "serve", "--index", str(folder)]
    refused = subprocess.run([*cli, "--faiss-gpu", "on", "--port", str(free_port())], cwd=root,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"error: --faiss-gpu on, but the index cannot go to a GPU: {cpu_build_reason()}"
    ]
    port = free_port()
    proc = subprocess.Popen([*cli, "--port", str(port)], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    (line,) = [x for x in out.splitlines() if x.startswith("serving")]
    assert line.startswith(
        f"serving 100 docs on http://127.0.0.1:{port}/retrieve; index on the CPU "
        f"({cpu_build_reason()}), query encoder on cpu (ready in "
    )


def test_search_r1s_download_as_it_lands_is_refused_with_the_two_commands(tmp_path, capsys):
    """Search-R1's download.py leaves the index in parts and the corpus gzipped: serve names
    `make data-index` and the two commands that make the folder it opens, in one line."""
    from common.retrieval.__main__ import main

    landed = tmp_path / "search_r1"
    landed.mkdir()
    for name in ("part_aa", "part_ab", "wiki-18.jsonl.gz"):
        (landed / name).write_bytes(b"x")
    assert main(["serve", "--index", str(landed), "--port", "0"]) == 2
    assert capsys.readouterr().err == (
        f"error: {landed}: holds Search-R1's download as it lands (part_aa, part_ab, "
        "wiki-18.jsonl.gz), not yet the index and corpus serve opens: `make data-index "
        f"INDEX={landed}` joins and unzips them in place (and fetches what is missing), or by "
        f"hand: `cat {landed}/part_* > {landed}/e5_Flat.index` and `gzip -d "
        f"{landed}/wiki-18.jsonl.gz`\n"
    )
    (landed / "part_aa").unlink()
    (landed / "part_ab").rename(landed / "e5_Flat.index")  # joined, the corpus still zipped
    assert main(["serve", "--index", str(landed), "--port", "0"]) == 2
    assert capsys.readouterr().err.endswith(f"by hand: `gzip -d {landed}/wiki-18.jsonl.gz`\n")


@pytest.mark.slow
def test_serve_without_the_e5_encoder_offline_is_one_line(search_r1_folder, tmp_path):
    """No e5-base-v2 in the Hugging Face cache and the hub out of reach: one error line, exit 2
    (before: a 31-frame traceback from transformers)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_CACHE", None)
    run = subprocess.run(
        [sys.executable, "-m", "common.retrieval", "serve", "--index", str(search_r1_folder),
         "--port", "0", "--faiss-gpu", "off"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 2
    (line,) = run.stderr.splitlines()
    assert line.startswith("error: the encoder intfloat/e5-base-v2 could not be loaded (")
    assert line.endswith(
        "); fetch it where the hub is reachable: `hf download intfloat/e5-base-v2` (into the "
        "Hugging Face cache this machine reads; `make data-index` does it for e5-base-v2), or "
        "give a local folder (--dense-encoder DIR)"
    )
