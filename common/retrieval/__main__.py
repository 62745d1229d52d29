"""Command line: build an index, or serve one over HTTP (Search-R1's /retrieve protocol).

    python -m common.retrieval index --corpus wiki.jsonl --out idx/ [--dense-encoder DIR]
    python -m common.retrieval serve --corpus wiki.jsonl [--index idx/] [--port 8000]

`serve --index` opens a saved index folder (`retriever.json`), or Search-R1's index as it is
downloaded (a folder with `e5_Flat.index` and `wiki-18.jsonl`, or `--index e5_Flat.index
--corpus wiki-18.jsonl`; queries encoded by `--dense-encoder`, e5-base-v2 by default; a flat
index on every GPU a GPU build of faiss sees, `--faiss-gpu`). The start line says where the
index searches, and why on the CPU when it does. Otherwise it builds BM25 from `--corpus` (and saves it
into `--index` when given, so the next start is fast); a non-empty `--index` folder that holds
neither kind of index is an error, not a place to build into.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common.retrieval.base import CorpusError, CorpusRetriever
from common.retrieval.doc_store import CONFIG_FILE
from common.retrieval.index_folder import build_index, is_index_folder, load_index
from common.retrieval.search_r1_index import (
    E5,
    open_search_r1,
    search_r1_download,
    search_r1_files,
)
from common.retrieval.server import ServerLimits, bind, serve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m common.retrieval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    index = sub.add_parser("index", help="build an index folder from a jsonl corpus")
    index.add_argument(
        "--corpus", required=True, help='jsonl of {"id","contents"} or {"id","title","text"}'
    )
    index.add_argument("--out", required=True, help="index folder to write")
    index.add_argument("--dense-encoder", help="HF encoder folder (e.g. e5-base-v2); BM25 without")
    index.add_argument(
        "--index-type",
        default="flat",
        choices=("flat", "pq", "ivfpq"),
        help="FAISS index for --dense-encoder",
    )
    index.add_argument("--batch-size", type=int, default=64, help="encoder batch size")

    srv = sub.add_parser("serve", help="serve POST /retrieve and GET /health")
    srv.add_argument("--corpus", help="jsonl corpus to index with BM25 when --index holds none")
    srv.add_argument("--index", help="index folder to open (or to save the BM25 index into)")
    srv.add_argument("--host", default="127.0.0.1", help="interface (loopback by default)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--topk", type=int, default=3, help="top-k when a request gives none")
    srv.add_argument("--max-queries", type=int, default=512, help="queries a request")
    srv.add_argument("--max-query-chars", type=int, default=2048, help="characters a query")
    srv.add_argument("--max-topk", type=int, default=100, help="largest topk a request may ask")
    srv.add_argument(
        "--max-body-bytes",
        type=int,
        default=ServerLimits.max_body_bytes,
        help="larger request bodies get a 413",
    )
    srv.add_argument(
        "--body-timeout-s",
        type=float,
        default=ServerLimits.body_timeout_s,
        help="seconds a request body has to arrive whole after its headers (else a 408)",
    )
    srv.add_argument(
        "--max-connections",
        type=int,
        default=ServerLimits.max_connections,
        help="connections open at once (lowered to what `ulimit -n` holds); past it the oldest "
        "idle one is closed for the new one",
    )
    srv.add_argument(
        "--idle-timeout-s",
        type=float,
        default=ServerLimits.idle_timeout_s,
        help="seconds a connection with no request in progress stays open after it opened or "
        "got its last answer (keep-alive; also the time to send a request's headers)",
    )
    srv.add_argument("--no-mmap", action="store_true", help="read the index into memory")
    srv.add_argument(
        "--dense-encoder",
        default=E5,
        help=f"query encoder of a Search-R1 index: folder or hub id (default {E5})",
    )
    srv.add_argument(
        "--faiss-gpu",
        choices=("auto", "on", "off"),
        default="auto",
        help="where a flat dense index searches: auto (every GPU a GPU build of faiss sees, fp16, "
        "sharded; else the CPU, and the start line says why), on (the GPUs, else an error), "
        "off (the CPU)",
    )
    srv.add_argument(
        "--no-faiss-gpu",
        dest="faiss_gpu",
        action="store_const",
        const="off",
        help="--faiss-gpu off",
    )
    srv.add_argument(
        "--bm25-backend",
        default="auto",
        choices=("auto", "numba", "numpy"),
        help="bm25s scoring backend (auto: numba when installed)",
    )
    return parser


def _open_for_serving(args: argparse.Namespace) -> CorpusRetriever:
    gpu = args.faiss_gpu
    if gpu == "on":  # before anything loads
        from common.retrieval.dense import IndexPlacementError, faiss_gpu_problem

        if why := faiss_gpu_problem():
            raise IndexPlacementError(f"--faiss-gpu on, but the index cannot go to a GPU: {why}")
    if args.index and Path(args.index).is_file():  # Search-R1's flags: the .index file and corpus
        if not args.corpus:
            raise FileNotFoundError(f"{args.index}: an index file needs --corpus (its jsonl)")
        return open_search_r1(args.index, args.corpus, args.dense_encoder, gpu=gpu)
    if args.index and is_index_folder(args.index):
        return load_index(
            args.index, mmap=not args.no_mmap, backend=args.bm25_backend, faiss_gpu=gpu
        )
    if args.index and (files := search_r1_files(args.index)):
        return open_search_r1(*files, args.dense_encoder, gpu=gpu)
    if args.index and (todo := search_r1_download(args.index)):
        raise FileNotFoundError(todo)
    if args.index and Path(args.index).is_dir() and any(Path(args.index).iterdir()):
        raise FileNotFoundError(
            f"{args.index}: holds neither a saved index ({CONFIG_FILE}) nor Search-R1's (one "
            "*.index and one *.jsonl); not building BM25 into it. Give the folder Search-R1's "
            "download wrote, or an empty or new folder for a BM25 index of --corpus"
        )
    if not args.corpus:
        raise FileNotFoundError(f"{args.index}: no index there, and no --corpus to build one")
    if args.index:
        return build_index(args.corpus, args.index, backend=args.bm25_backend)
    from common.retrieval.bm25 import BM25Retriever

    return BM25Retriever.from_corpus(args.corpus, backend=args.bm25_backend, show_progress=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "index":
            retriever = build_index(
                args.corpus, args.out, args.dense_encoder, args.index_type, args.batch_size
            )
            print(f"indexed {len(retriever):,} docs into {args.out}")
            return 0
        if not (args.index or args.corpus):
            raise FileNotFoundError("serve needs --corpus or --index")
        limits = ServerLimits(
            args.topk,
            args.max_queries,
            args.max_query_chars,
            args.max_topk,
            args.max_body_bytes,
            args.max_connections,
            args.idle_timeout_s,
            args.body_timeout_s,
        )
        start = time.perf_counter()
        try:  # before the index loads: a port in use is found at once
            sock = bind(args.host, args.port)
        except OSError as e:
            raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
        try:
            retriever = _open_for_serving(args)
        except BaseException:
            sock.close()
            raise
        # The first search compiles bm25s's numba kernels; do it before taking requests, with
        # words the index holds (a query of unknown words never reaches the kernels).
        retriever.search([warmup_query(retriever)], 1)
        print(
            f"serving {len(retriever):,} docs on http://{args.host}:{args.port}/retrieve; "
            f"{placement(retriever)} (ready in {time.perf_counter() - start:.1f}s)",
            flush=True,
        )
    except (CorpusError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    serve(retriever, len(retriever), args.host, args.port, limits, sock)
    return 0


def placement(retriever: CorpusRetriever) -> str:
    """Where the retriever searches: a dense index's device (``DenseRetriever.index_where``)
    and its query encoder's; BM25's, the CPU."""
    where = getattr(retriever, "index_where", None)
    if where is None:
        return "BM25 index on the CPU"
    return f"index on {where}, query encoder on {retriever.encoder.device}"


def warmup_query(retriever: CorpusRetriever) -> str:
    """The title and first words of the corpus's first passage: a query that matches."""
    docs = getattr(retriever, "docs", None)
    if docs is None or not len(docs):
        return "warm up"
    doc = docs.take([[0]], [[0.0]])[0][0]
    return " ".join(f"{doc.title} {doc.text}".split()[:16])


if __name__ == "__main__":
    sys.exit(main())
