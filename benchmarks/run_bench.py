"""``make bench``: every benchmark script in turn, then one summary table (``summary.py``).

Each script runs in its own process with ``BENCH_DIR`` set, its output in ``<out>/<name>.log``;
it writes ``<out>/<name>.json`` (``bench_result.write_result``). A script that exits non-zero,
runs past ``--timeout`` or writes no result is recorded as failed (with the last line of its
output) and the others go on. ``--quick`` runs each with its shortest setting (minutes in all;
the numbers are then noisy). No script writes ``benchmarks/RESULTS.md`` from here.

    .venv/bin/python benchmarks/run_bench.py [--quick] [--only NAME ...] [--out runs/bench]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import summary  # noqa: E402


@dataclass(frozen=True)
class Bench:
    """One script run: the result name it writes, its arguments, and its ``--quick`` ones."""

    name: str
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()


BENCHES = (
    Bench("bench_retrieval", "bench_retrieval.py", ("--no-readme",),
          ("--no-readme", "--repeats", "3", "--min-queries", "500")),
    Bench("bench_retrieval_memory", "bench_retrieval_memory.py", ("--no-readme",),
          ("--no-readme", "--docs", "20000", "--vectors", "5000", "--train", "2000")),
    Bench("bench_dense_flat", "bench_dense_flat.py", ("--no-readme",),
          ("--no-readme", "--sizes", "20000,80000", "--batches", "1,64", "--repeats", "2")),
    Bench("bench_cer_scoring", "bench_cer_scoring.py", (),
          ("--repeats", "2", "--g", "8", "--solution-len", "100")),
    Bench("bench_cer_step", "bench_cer_step.py", (), ("--repeats", "2", "--b", "4", "--g", "4")),
    Bench("bench_shared_prompt", "bench_shared_prompt.py", (),
          ("--repeats", "1", "--b", "2", "--g", "4")),
    Bench("bench_zero_advantage", "bench_zero_advantage.py", (),
          ("--b", "2", "--g", "4", "--response-tokens", "64")),
    Bench("bench_rollout", "bench_rollout.py", (),
          ("--questions", "8", "--n", "4", "--repeats", "1", "--fixed-prompts", "8",
           "--fixed-tokens", "32", "--fixed-repeats", "1")),
    Bench("bench_grpo_breakdown", "bench_grpo_breakdown.py", (), ("--steps", "2")),
    Bench("bench_grpo_step", "bench_grpo_step.py", (),
          ("--steps", "2", "--rounds", "1", "--prompts", "2", "--n", "2", "--tokens", "16")),
    Bench("bench_arco.calls", "bench_arco.py", ("calls",), ("calls", "--repeats", "1")),
    Bench("bench_arco.memory", "bench_arco.py", ("memory",), ("memory",)),
    # rubric.shared_prefix true vs false, side by side from one warmup (needs the tiny assets)
    Bench("bench_arco", "bench_arco.py", ("shared",), ("shared", "--dense-steps", "2")),
)  # fmt: skip


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_one(bench: Bench, out: Path, quick: bool, timeout: float, python: str) -> dict:
    """Run one script; returns its result record (a failed one when it did not finish well)."""
    result = out / f"{bench.name}.json"
    result.unlink(missing_ok=True)  # an old result must not stand in for a failed run
    argv = [python, str(HERE / bench.script), *(bench.quick if quick else bench.args)]
    env = {**os.environ, "BENCH_DIR": str(out)}
    start = time.perf_counter()
    print(f"[bench] {bench.name}: {' '.join([bench.script, *argv[2:]])}", flush=True)
    log = out / f"{bench.name}.log"
    try:
        with log.open("w", encoding="utf-8") as f:
            rc = subprocess.run(
                argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
            ).returncode
        error = f"exit code {rc}: {last_line(log.read_text(encoding='utf-8'))}" if rc else ""
    except subprocess.TimeoutExpired:
        error = f"ran past --timeout {timeout:.0f} s"
    seconds = time.perf_counter() - start
    record = json.loads(result.read_text(encoding="utf-8")) if result.exists() else {}
    if not error and not record:
        error = "finished without writing its result file"
    if error:
        record = {**record, "name": bench.name, "status": "failed", "error": error}
        result.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"[bench] {bench.name}: {'failed, ' + error if error else 'ok'} ({seconds:.0f} s)")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="each script's shortest setting")
    names = [b.name for b in BENCHES]
    parser.add_argument("--only", nargs="+", choices=names, help="these benchmarks only")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a script, at most")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = [b for b in BENCHES if not args.only or b.name in args.only]
    for bench in chosen:
        run_one(bench, args.out, args.quick, args.timeout, sys.executable)
    (args.out / "order.txt").write_text("\n".join(b.name for b in chosen) + "\n")
    summary.main([str(args.out)])


if __name__ == "__main__":
    main()
