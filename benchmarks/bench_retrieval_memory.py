"""Memory of the retrieval indexes, measured small and extrapolated to 1M and 21M passages.

BM25: a synthetic corpus (random words from a Zipfian vocabulary, ~100 words a passage, as
Wikipedia-2018's 100-word passages) is indexed and saved; fresh processes then load it with
and without memory mapping and report resident memory (anonymous: private heap, the real
cost; file-backed: mapped pages the OS can drop and share) after loading and after a batch
of queries. Dense: FAISS index files built from random unit vectors; bytes a vector is
the growth of the file per added vector (flat 768-dim float32: 3,072 B; PQ m=64: 64 B).

    python benchmarks/bench_retrieval_memory.py [--docs 200000] [--vectors 50000]

Prints a markdown table and writes it into benchmarks/RESULTS.md under "## Retrieval".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_result import Check, write_result  # noqa: E402
from bench_retrieval import update_readme  # noqa: E402

from common.retrieval import BM25Retriever, Doc  # noqa: E402
from common.retrieval.dense import import_faiss, make_index  # noqa: E402

TARGETS = {"1M": 1_000_000, "21M (Wikipedia-2018)": 21_000_000}
MiB = 2**20


def synthetic_docs(n: int, words: int, vocab: int, seed: int) -> tuple[list[Doc], list[str]]:
    """n passages of `words` words drawn with Zipf-like frequencies p(rank r) ~ 1/r."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 11, size=vocab)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype="S1").astype(str)
    lexicon = np.array(["".join(rng.choice(letters, size)) for size in lengths])
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    docs = []
    for start in range(0, n, 10_000):
        ids = rng.choice(vocab, size=(min(10_000, n - start), words), p=p)
        docs += [
            Doc(str(start + i), " ".join(lexicon[r[:2]]), " ".join(lexicon[r]), 0.0)
            for i, r in enumerate(ids)
        ]
    queries = [" ".join(lexicon[rng.choice(vocab, 6, p=p)]) for _ in range(200)]
    return docs, queries


def rss() -> dict[str, float]:
    """Resident memory of this process in MiB: anonymous and file-backed."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {key: int(status[key].split()[0]) / 1024 for key in ("RssAnon", "RssFile")}


def measure_load(folder: str, mmap: bool, backend: str, queries: list[str]) -> dict[str, float]:
    """Run in a fresh process: memory added by loading the index and by searching, and the
    search time a query (after a warm-up search, which compiles numba's kernels)."""
    before = rss()
    start = time.perf_counter()
    retriever = BM25Retriever.load(folder, mmap=mmap, backend=backend)
    load_s = time.perf_counter() - start
    loaded = rss()
    retriever.search(queries[:2], 10)
    start = time.perf_counter()
    retriever.search(queries, 10)
    search_ms = (time.perf_counter() - start) * 1000 / len(queries)
    searched = rss()
    return {
        "load_s": load_s,
        "search_ms": search_ms,
        **{f"load_{k}": loaded[k] - before[k] for k in before},
        **{f"search_{k}": searched[k] - before[k] for k in before},
    }


def bm25_metrics(n: int, args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """Bytes on disk and resident in fresh processes for an n-passage index, and the search
    time a query by backend (mmap)."""
    docs, queries = synthetic_docs(n, args.words, args.vocab, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        BM25Retriever.from_docs(docs, backend="numpy").save(tmp)
        print(f"built {n:,} passages in {time.perf_counter() - start:.0f}s", file=sys.stderr)
        del docs
        sizes = {p.name: p.stat().st_size for p in Path(tmp).iterdir()}
        texts = sizes["docs.jsonl"] + sizes["docs.offsets.npy"]
        metrics = {"disk: BM25 index": sum(sizes.values()) - texts, "disk: passage texts": texts}
        timing = {}
        # numba's compiler takes memory of its own: memory is measured with numpy.
        for mmap, backend in ((False, "numpy"), (True, "numpy"), (True, "numba")):
            cmd = [sys.executable, __file__, "--measure", tmp, "--mmap", str(int(mmap))]
            out = subprocess.run(
                [*cmd, "--backend", backend],
                input=json.dumps(queries),
                capture_output=True,
                text=True,
                check=True,
            )
            m = json.loads(out.stdout.strip().splitlines()[-1])
            if mmap:
                timing[backend] = m["search_ms"]
            if backend == "numba":
                continue
            how = "mmap" if mmap else "in memory"
            metrics[f"RSS {how}, loaded: anonymous"] = m["load_RssAnon"] * MiB
            metrics[f"RSS {how}, 200 queries later: anonymous"] = m["search_RssAnon"] * MiB
            metrics[f"RSS {how}, 200 queries later: file-backed"] = m["search_RssFile"] * MiB
    return metrics, timing


def bm25_rows(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, float]]:
    """Per-passage slope and fixed part from indexes of n/2 and n passages; the search time
    a query at n."""
    n1, n2 = args.docs // 2, args.docs
    (small, _), (large, timing) = bm25_metrics(n1, args), bm25_metrics(n2, args)
    return [_row(f"BM25 {key}", small[key], large[key], n1, n2) for key in large], timing


def dense_rows(args: argparse.Namespace) -> list[list[str]]:
    """File growth per vector for each FAISS index type (random unit vectors)."""
    faiss = import_faiss()
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((2 * args.vectors, args.dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "index.faiss")
        labels = {
            "flat": "IndexFlatIP",
            "pq": f"IndexPQ m={args.pq_m}",
            "ivfpq": f"IndexIVFPQ m={args.pq_m}",
        }
        for index_type, label in labels.items():
            index = make_index(args.dim, index_type, x[: args.train], pq_m=args.pq_m)
            sizes = []
            for half in (x[: args.vectors], x[args.vectors :]):
                index.add(half)
                faiss.write_index(index, path)
                sizes.append(os.path.getsize(path))
            name = f"dense {label}, {args.dim}-dim: file"
            rows.append(_row(name, sizes[0], sizes[1], args.vectors, 2 * args.vectors))
    return rows


def _size(n_bytes: float) -> str:
    if abs(n_bytes) >= 2**30:
        return f"{n_bytes / 2**30:,.2f} GiB"
    return f"{n_bytes / MiB:,.1f} MiB"


def _row(label: str, at_n1: float, at_n2: float, n1: int, n2: int) -> list[str]:
    """Bytes a passage (slope between two sizes), fixed part, and the extrapolations."""
    per = (at_n2 - at_n1) / (n2 - n1)
    fixed = at_n1 - per * n1
    return [label, f"{per:,.1f}", _size(fixed), *(_size(fixed + per * t) for t in TARGETS.values())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000, help="synthetic BM25 passages")
    parser.add_argument("--words", type=int, default=100, help="words a passage")
    parser.add_argument("--vocab", type=int, default=100_000, help="distinct words")
    parser.add_argument("--vectors", type=int, default=50_000, help="dense vectors (added twice)")
    parser.add_argument("--dim", type=int, default=768, help="embedding size (e5-base: 768)")
    parser.add_argument("--pq-m", type=int, default=64, help="PQ bytes a vector")
    parser.add_argument("--train", type=int, default=20_000, help="PQ training vectors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-readme", action="store_true", help="only print the table")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--mmap", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="numpy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # the child process of bm25_rows
        queries = json.loads(sys.stdin.read())
        print(json.dumps(measure_load(args.measure, bool(args.mmap), args.backend, queries)))
        return
    # faiss's OpenMP threads spin-wait; one thread keeps training sane on a shared machine.
    import_faiss().omp_set_num_threads(1)
    rows, timing = bm25_rows(args)
    rows += dense_rows(args)
    head = ["what", "bytes a passage", "fixed", *(f"at {name}" for name in TARGETS)]
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in rows]
    )
    body = (
        f"### Memory per passage\n\n{table}\n\n"
        f"Bytes a passage = growth between two sizes, fixed = the rest; extrapolated linearly. "
        f"BM25: {args.docs // 2:,} and {args.docs:,} synthetic passages of {args.words} words "
        f"from a Zipfian vocabulary of {args.vocab:,} words (real text keeps adding words, so "
        f"its vocabulary, here in the fixed part, grows too); RSS of a fresh process that loads "
        f"the index (numpy backend), then after 200 six-word queries, which took "
        f"{timing['numpy']:.1f} ms a query with the numpy backend and {timing['numba']:.1f} ms "
        f"with numba (mmap, top 10). File-backed pages are the OS's page cache of the mapped "
        f"files: shared, and dropped under memory pressure. Dense: "
        f"{args.vectors:,} and {2 * args.vectors:,} random unit vectors, PQ trained on "
        f"{args.train:,}.\n"
        "`python benchmarks/bench_retrieval_memory.py`"
    )
    print(body)
    checks = [
        Check(f"{r[0]}: bytes a passage", float(r[1].replace(",", "")), unit="B") for r in rows
    ]
    write_result("bench_retrieval_memory", checks, f"BM25 {args.docs:,}, dense {args.vectors:,}")
    if not args.no_readme:
        update_readme("bench_retrieval_memory", body)


if __name__ == "__main__":
    main()
