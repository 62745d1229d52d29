"""CER scoring: prefix-shared (prompt once, each solution once, caches reused) vs every pair alone.

One GRPO group as ``cer.rewards.scoring.score_group`` scores it: G solutions (prompt + ~200 sampled
tokens each), and after each of them the reference and U distinct answers, each closed by its
brace token. Both scorers run on the same random Qwen3, the same pairs, alternately; the table
gives the median of the repeats and the largest difference between their logprobs.

    .venv/bin/python benchmarks/bench_cer_scoring.py [--repeats 5] [--threads 1] [--write-readme]

``--write-readme`` puts the table into ``benchmarks/RESULTS.md`` under ``## CER scoring``
(replacing that section only).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from bench_result import Check, write_result
from transformers import Qwen3Config, Qwen3ForCausalLM

from cer.rewards.scoring import ScoreFn, hf_prefix_scorer, naive_scorer, shared_trunks

README = Path(__file__).parent / "RESULTS.md"
SECTION = "## CER scoring"
SHARED = "prefix-shared (`hf_prefix_scorer`)"
NAIVE = "every pair from scratch (`naive_scorer`)"


def make_group(
    g: int, n_answers: int, prompt_len: int, solution_len: int, vocab: int, seed: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The (prefix, continuation) pairs of one group, those of a prefix next to each other."""
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=gen).tolist()

    prompt = ids(prompt_len)
    closing = ids(1)
    # the reference and the distinct answers: 1 to 6 tokens, then the closing brace
    candidates = [
        ids(int(torch.randint(1, 7, (1,), generator=gen))) + closing for _ in range(1 + n_answers)
    ]
    prefixes, continuations = [], []
    for _ in range(g):
        n = solution_len + int(torch.randint(-20, 21, (1,), generator=gen))
        prefix = prompt + ids(n)
        for c in candidates:
            prefixes.append(prefix)
            continuations.append(c)
    return prefixes, continuations


def time_scorer(score: ScoreFn, prefixes, continuations) -> tuple[float, list[list[float]]]:
    start = time.perf_counter()
    out = score(prefixes, continuations)
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--g", type=int, default=16, help="solutions in the group")
    parser.add_argument(
        "--answers", type=int, default=6, help="distinct answers besides the reference"
    )
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--solution-len", type=int, default=200)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument(
        "--batch-size", type=int, default=16, help="pairs per forward, both scorers"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--threads",
        type=lambda text: [int(t) for t in text.split(",")],
        default=[1],
        help="torch thread counts to measure, comma-separated (default 1: on a CPU shared with "
        "other jobs, multi-threaded timings of many small ops measure thread stalls)",
    )
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()

    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128),
        head_dim=64,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    prefixes, continuations = make_group(
        args.g, args.answers, args.prompt_len, args.solution_len, args.vocab, seed=1
    )
    scorers = {
        SHARED: hf_prefix_scorer(model, args.batch_size),
        NAIVE: naive_scorer(model, args.batch_size),
    }
    n_pairs = len(prefixes)
    distinct = list({tuple(p): p for p in prefixes}.values())
    # the shared prompt once per trunk, then each solution's own tokens once
    prefix_tokens = sum(
        t.length + sum(len(distinct[m]) - t.length for m in t.members)
        for t in shared_trunks(distinct)
    )
    cont_tokens = sum(len(c) for c in continuations)
    tokens = {
        SHARED: prefix_tokens + cont_tokens,
        NAIVE: sum(len(p) for p in prefixes) + cont_tokens,
    }
    rows = [
        "| torch threads | scorer | tokens through the model | median time (s) | speed-up |",
        "|---|---|---|---|---|",
    ]
    max_diff, load_before = 0.0, os.getloadavg()[0]
    speedups: list[float] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for score in scorers.values():  # warm-up
            score(prefixes[:2], continuations[:2])
        times: dict[str, list[float]] = {name: [] for name in scorers}
        outputs: dict[str, list[list[float]]] = {}
        for _ in range(args.repeats):
            for name, score in scorers.items():  # alternate, so drift hits both alike
                seconds, outputs[name] = time_scorer(score, prefixes, continuations)
                times[name].append(seconds)
        shared, naive = outputs.values()
        max_diff = max(
            max_diff,
            *(
                abs(a - b)
                for x, y in zip(shared, naive, strict=True)
                for a, b in zip(x, y, strict=True)
            ),
        )
        medians = {name: statistics.median(t) for name, t in times.items()}
        baseline = medians[NAIVE]
        speedups.append(baseline / medians[SHARED])
        rows += [
            f"| {threads} | {name} | {tokens[name]:,} | {medians[name]:.3f} | "
            f"{baseline / medians[name]:.2f}x |"
            for name in scorers
        ]
    setting = (
        f"G = {args.g} solutions of {args.prompt_len} prompt + ~{args.solution_len} solution tokens, "
        f"reference + {args.answers} distinct answers ({n_pairs} pairs, {cont_tokens} continuation "
        f"tokens); random Qwen3, {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, "
        f"float32; batch {args.batch_size} pairs; median of {args.repeats} alternating runs; "
        f"{platform.machine()} CPU, {os.cpu_count()} cores, load average {load_before:.1f} before "
        f"and {os.getloadavg()[0]:.1f} after; "
        f"torch {torch.__version__}. Largest logprob difference between the two scorers: "
        f"{max_diff:.1e}."
    )
    table = "\n".join(rows)
    print(setting + "\n\n" + table)
    write_result(
        "bench_cer_scoring",
        [
            Check(f"prefix-shared vs scratch (G = {args.g}, {t} threads)", x, ">=", 3.0, "x")
            for t, x in zip(args.threads, speedups, strict=True)
        ]
        + [Check("largest logprob difference", max_diff, "<=", 1e-5)],
        setting,
    )
    if max_diff > 1e-5:
        raise SystemExit(f"the scorers disagree: largest logprob difference {max_diff:.2e} > 1e-5")
    if args.write_readme:
        command = "`.venv/bin/python benchmarks/bench_cer_scoring.py --write-readme`"
        write_section(f"{SECTION}\n\n{command}: {setting}\n\n{table}\n")


def write_section(section: str) -> None:
    """Replace the ``## CER scoring`` section of benchmarks/RESULTS.md (or append it)."""
    text = README.read_text(encoding="utf-8") if README.exists() else "# Benchmarks\n"
    start = text.find(SECTION + "\n")
    if start < 0:
        before, after = text.rstrip("\n") + "\n\n", ""
    else:
        end = text.find("\n## ", start + len(SECTION))
        before, after = text[:start], (text[end + 1 :] if end >= 0 else "")
    text = before + section.rstrip("\n") + "\n" + ("\n" + after if after else "")
    README.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
