"""Queries per second of a flat inner-product index (FAISS ``IndexFlatIP``, 768 dimensions: the
layout of Search-R1's E5 index over Wikipedia-2018) on this machine's CPU, beside what FAISS
publishes for brute-force search on a GPU.

A flat search costs one multiply-add per dimension for every (query, vector) pair, so its time
grows linearly with the vectors: ``t(N) = fixed + N * per_vector`` for a batch of queries. The
index is built twice from random unit vectors (``--sizes``, what fits in this machine's memory),
each batch size is timed on both (median of ``--repeats``), the two points give ``per_vector``
and ``fixed``, and the line is followed to Wikipedia-2018's 21,015,324 passages (a 64.6 GB index
that does not fit here).

The GPU side is FAISS's own published figures, not a measurement here: its wiki's "Low level
benchmarks" page times brute-force k-means (n = 1M points, d = 256, k = 20,000 centroids, 25
iterations: n * d * k * 25 = 128 T multiply-adds, the same distance computation a flat search
does) on a CPU and on GPUs; dividing by the multiply-adds of one query against 21,015,324 x 768
gives the queries per second that throughput would serve. Its "Faiss on the GPU" page puts a
single GPU at 5-10x the CPU, with near-linear speedup over several.

    python benchmarks/bench_dense_flat.py [--sizes 250000,1000000] [--batches 1,16,128] [--k 5]

Prints a markdown table and writes it into benchmarks/RESULTS.md under "## Retrieval".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_result import Check, write_result  # noqa: E402
from bench_retrieval import update_readme  # noqa: E402

from common.retrieval.dense import import_faiss  # noqa: E402

WIKI18 = 21_015_324  # rows of Search-R1's wiki-18.jsonl, vectors of its e5_Flat.index
DIM = 768  # e5-base-v2
KMEANS_MACS = 1_000_000 * 256 * 20_000 * 25  # FAISS wiki, "Low level benchmarks": 128 T
FAISS_PUBLISHED = (  # (what ran, seconds for KMEANS_MACS multiply-adds), as the wiki lists them
    ("the wiki's CPU", 11 * 60),
    ("1 Maxwell Titan X", 111),
    ("1 Pascal P100, float32 math", 55),
    ("1 Pascal P100, float16 math", 34),
    ("4 Pascal P100, float16 math", 16),
)
WIKI = "https://github.com/facebookresearch/faiss/wiki"


def unit_vectors(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def build(n: int, dim: int, seed: int):  # noqa: ANN201 (a faiss index)
    faiss = import_faiss()
    index = faiss.IndexFlatIP(dim)
    rng = np.random.default_rng(seed)
    for start in range(0, n, 100_000):
        index.add(unit_vectors(min(100_000, n - start), dim, rng))
    return index


def time_search(index, queries: np.ndarray, k: int, repeats: int) -> float:  # noqa: ANN001
    """Median seconds of one ``index.search`` of ``queries`` (one untimed call first)."""
    index.search(queries, k)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        index.search(queries, k)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="250000,1000000", help="two index sizes (vectors)")
    parser.add_argument("--batches", default="1,16,128", help="queries a search call")
    parser.add_argument("--k", type=int, default=5, help="top-k (EviBack's agent.topk)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-readme", action="store_true", help="only print the table")
    args = parser.parse_args()
    small, large = (int(x) for x in args.sizes.split(","))
    batches = [int(x) for x in args.batches.split(",")]
    faiss = import_faiss()
    threads = faiss.omp_get_max_threads()
    load = os.getloadavg()[0]
    queries = unit_vectors(max(batches), DIM, np.random.default_rng(args.seed + 1))
    seconds: dict[tuple[int, int], float] = {}
    for n in (small, large):
        index = build(n, DIM, args.seed)
        for b in batches:
            seconds[n, b] = time_search(index, queries[:b], args.k, args.repeats)
            print(f"{n:,} vectors, {b} queries: {seconds[n, b] * 1e3:,.1f} ms", flush=True)
        del index
    rows, checks, wiki_qps = [], [], {}
    for b in batches:
        per_vector = (seconds[large, b] - seconds[small, b]) / (large - small)  # s a vector
        fixed = max(0.0, seconds[small, b] - small * per_vector)
        at_wiki = fixed + WIKI18 * per_vector
        ns_pair = per_vector / b * 1e9
        wiki_qps[b] = b / at_wiki
        rows.append([
            f"{b}", f"{b / seconds[small, b]:,.1f}", f"{b / seconds[large, b]:,.1f}",
            f"{ns_pair:.3f}", f"{DIM / ns_pair:.1f}", f"{at_wiki:,.2f}", f"{b / at_wiki:,.2f}",
        ])  # fmt: skip
        checks.append(Check(f"flat IP 768-dim on CPU, {b} queries a call: queries/s at "
                            f"{WIKI18:,} vectors (extrapolated)", b / at_wiki, unit="q/s"))  # fmt: skip
    head = ["queries a call", f"q/s at {small:,}", f"q/s at {large:,}", "ns a (query, vector)",
            "multiply-adds/ns", f"s a call at {WIKI18:,}", f"q/s at {WIKI18:,}"]  # fmt: skip
    per_query = WIKI18 * DIM
    gpu_rows = [
        [what, f"{secs:,}", f"{KMEANS_MACS / secs / 1e12:.2f}", f"{KMEANS_MACS / secs / per_query:,.0f}"]
        for what, secs in FAISS_PUBLISHED
    ]  # fmt: skip
    gpu_head = ["FAISS's published brute-force k-means run", "s for 128 T multiply-adds",
                "T multiply-adds/s", f"as q/s at {WIKI18:,} x {DIM}"]  # fmt: skip

    def table(h: list[str], r: list[list[str]]) -> str:
        return "\n".join(["| " + " | ".join(h) + " |", "|" + "---|" * len(h)]
                         + ["| " + " | ".join(x) + " |" for x in r])  # fmt: skip

    cpu = f"{os.cpu_count()} CPUs ({os.uname().machine})"
    # EviBack's paper step: 64 questions x 8 rollouts, at most one search a turn, 10 turns
    step_queries = 64 * 8 * 10
    here = wiki_qps[batches[-1]]
    p100 = KMEANS_MACS / dict(FAISS_PUBLISHED)["1 Pascal P100, float16 math"] / per_query
    body = (
        "### Flat index: CPU measured, GPU as FAISS publishes it\n\n"
        f"{table(head, rows)}\n\n"
        f"`IndexFlatIP`, {DIM} dims, random unit vectors, k={args.k}, median of {args.repeats}; "
        f"faiss {faiss.__version__} (faiss-cpu), {threads} OpenMP threads, {cpu}, load average "
        f"{load:.1f} at start. The two sizes give the cost a vector, followed to Wikipedia-2018's "
        f"{WIKI18:,} passages (a {WIKI18 * DIM * 4 / 1e9:.1f} GB index in fp32, "
        f"{WIKI18 * DIM * 2 / 1e9:.1f} GB in fp16 on GPUs). An EviBack step at paper scale "
        f"asks at most {step_queries:,} searches (64 questions x 8 rollouts x 10 turns): "
        f"{step_queries / here / 3600:,.1f} hours at this machine's rate for {batches[-1]} "
        f"queries a call, {step_queries / p100:,.0f} s at one P100's published rate below.\n\n"
        f"{table(gpu_head, gpu_rows)}\n\n"
        f"FAISS's wiki, [Low level benchmarks]({WIKI}/Low-level-benchmarks): k-means of 1M "
        "points in 256 dims to 20,000 centroids, 25 iterations, n x d x k x 25 = 128 T "
        "multiply-adds of brute-force distance computation; the last column divides that rate "
        f"by one query's {per_query / 1e9:.1f} G multiply-adds against the E5 index (a batched "
        "rate: the k-means searches 1M points at once). [Faiss on the GPU]"
        f"({WIKI}/Faiss-on-the-GPU): a single GPU 5-10x the CPU, several GPUs near-linear. "
        "Those GPUs are 2016's; nothing here has run on a GPU.\n"
        "`python benchmarks/bench_dense_flat.py`"
    )
    print(body)
    write_result("bench_dense_flat", checks, f"sizes {small:,} and {large:,}, {cpu}")
    if not args.no_readme:
        update_readme("bench_dense_flat", body)


if __name__ == "__main__":
    main()
