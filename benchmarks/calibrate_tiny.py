"""Calibrate the tiny setting: world -> warmup -> dev greedy EM, pass@8 -> (optional) GRPO.

One row per call, appended to ``runs/calibrate/results.jsonl``; ``--table`` prints every row as
the markdown table of ``common/tinyworld/README.md``. Each stage is the project's own command
(``common.tinyworld build``, ``common.warmup``, ``common.search_grpo``) run as a subprocess,
so what is measured is what a user runs::

    python benchmarks/calibrate_tiny.py --name base --world "--dev 500" \\
        --warmup "steps=800" --grpo "steps=30 train.lr=1e-4" --grpo-seeds 0 1 2
    python benchmarks/calibrate_tiny.py --table
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from common.jsonl import read_jsonl

ROOT = Path("runs/calibrate")
RESULTS = ROOT / "results.jsonl"
WARMUP_CONFIG = "common/configs/warmup_tiny.yaml"
GRPO_CONFIG = "common/configs/grpo_tiny.yaml"


def _run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` with its output in ``log``; returns wall seconds; exits on failure."""
    print("[calibrate] $ " + shlex.join(cmd), flush=True)
    start = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"[calibrate] failed (exit {rc}); see {log}")
    return time.perf_counter() - start


def evaluate_model(
    model: Path, world: Path, questions: int, n: int, seed: int = 0, temperature: float = 1.0
) -> dict:
    """Greedy EM (overall and per question kind) and pass@n / mixed-group share on dev, and
    greedy EM on as many train questions (memorised facts versus reading)."""
    from transformers import AutoTokenizer

    from common.config import load_config
    from common.data import load_qa
    from common.metrics import exact_match
    from common.retrieval.bm25 import BM25Retriever
    from common.rl_loop import EngineConfig, build_engine, rollout_metrics
    from common.rollout import run_agent
    from common.search_grpo import GRPOConfig

    agent = load_config(GRPOConfig, GRPO_CONFIG, [f"agent.temperature={temperature}"]).agent
    tokenizer = AutoTokenizer.from_pretrained(model)
    engine = build_engine(EngineConfig(), str(model), None, tokenizer, seed)
    retriever = BM25Retriever.from_corpus(world / "corpus.jsonl")
    dev = load_qa(world / "dev.jsonl")[:questions]
    train = load_qa(world / "train.jsonl")[:questions]
    greedy_cfg = type(agent)(**{**vars(agent), "temperature": 0.0, "top_p": 1.0, "top_k": 0})
    out: dict = {}
    for name, examples in (("dev", dev), ("train", train)):
        trajs = run_agent(engine, tokenizer, retriever, examples, 1, greedy_cfg, "g:")
        m = rollout_metrics(trajs)
        out[f"{name}_em"] = m["em"]
        if name == "dev":
            out["dev_valid"] = m["valid_answer_rate"]
            kinds: dict[str, list[float]] = defaultdict(list)
            for t, ex in zip(trajs, examples, strict=True):
                kind = f"{ex.metadata['type']}{ex.metadata['hops']}"
                kinds[kind].append(exact_match(t.answer, t.golden_answers))
            out["dev_em_by_kind"] = {k: round(sum(v) / len(v), 3) for k, v in sorted(kinds.items())}
    trajs = run_agent(engine, tokenizer, retriever, dev, n, agent, "s:", seed=seed)
    correct = [exact_match(t.answer, t.golden_answers) for t in trajs]
    groups = [correct[i : i + n] for i in range(0, len(correct), n)]
    out[f"dev_pass@{n}"] = sum(max(g) for g in groups) / len(groups)
    out["dev_sampled_em"] = sum(correct) / len(correct)
    out["mixed_share"] = sum(0 < sum(g) < n for g in groups) / len(groups)
    return out


def _grpo_row(run_dir: Path) -> dict:
    rows = read_jsonl(run_dir / "metrics.jsonl", key="step")
    evals = [r for r in rows if "dev/em" in r]
    first, last = evals[0], evals[-1]
    return {
        "em_before": first["dev/em"],
        "em_after": last["dev/em"],
        "em_curve": [round(r["dev/em"], 3) for r in evals],
        "valid_before": first["dev/valid_answer_rate"],
        "valid_after": last["dev/valid_answer_rate"],
        "mixed_share": sum(r["mixed_group_share"] for r in rows if "mixed_group_share" in r)
        / max(sum("mixed_group_share" in r for r in rows), 1),
    }


def calibrate(args: argparse.Namespace) -> dict:
    py = sys.executable
    out = ROOT / args.name
    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"name": args.name, "world_args": args.world, "warmup": args.warmup}
    world = out / "world"
    if args.world_dir:
        world = Path(args.world_dir)
    elif not (world / "manifest.json").exists():
        cmd = [py, "-m", "common.tinyworld", "build", "--out", str(world), *shlex.split(args.world)]
        _run(cmd, out / "world.log")
    warm = out / "warm"
    if not (warm / "model" / "config.json").exists():
        cmd = [py, "-m", "common.warmup", "--config", WARMUP_CONFIG, f"world={world}"]
        cmd += [f"out={warm}", *shlex.split(args.warmup)]
        row["warmup_min"] = _run(cmd, out / "warmup.log") / 60
    loss = json.loads((warm / "sft_loss.json").read_text())
    row["sft_loss"] = loss[-1]["sft_loss"] if loss else None
    row["temperature"] = args.temperature
    cached = out / f"eval-{args.eval_questions}x{args.n}-t{args.temperature}.json"
    if not cached.exists():  # the warmup's, once
        result = evaluate_model(
            warm / "model", world, args.eval_questions, args.n, temperature=args.temperature
        )
        cached.write_text(json.dumps(result))
    row.update(json.loads(cached.read_text()))
    print(f"[calibrate] {json.dumps(row)}", flush=True)
    for seed in args.grpo_seeds if args.grpo is not None else []:
        run_dir = out / f"grpo-{args.grpo_tag}-s{seed}"
        cmd = [py, "-m", "common.search_grpo", "--config", GRPO_CONFIG, f"assets.world={world}"]
        cmd += [f"assets.model={warm / 'model'}", f"run_dir={run_dir}", f"seed={seed}"]
        cmd += [f"eval_questions={args.eval_questions}", *shlex.split(args.grpo)]
        minutes = _run(cmd, out / f"grpo-{args.grpo_tag}-s{seed}.log") / 60
        row.setdefault("grpo", []).append(
            {"seed": seed, "args": args.grpo, "minutes": minutes, **_grpo_row(run_dir)}
        )
        print(f"[calibrate] grpo seed {seed}: {json.dumps(row['grpo'][-1])}", flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def table() -> str:
    lines = [
        "| setting | warmup (min) | SFT loss | dev EM | pass@8 | mixed | train EM | GRPO | EM before -> after (mean of seeds) | valid answers |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in read_jsonl(RESULTS):  # appended to by every run: a torn last line is dropped
        grpo = r.get("grpo") or []
        if grpo:
            k = len(grpo)
            before = sum(g["em_before"] for g in grpo) / k
            after = sum(g["em_after"] for g in grpo) / k
            valid = (
                f"{sum(g['valid_before'] for g in grpo) / k:.2f} -> "
                f"{sum(g['valid_after'] for g in grpo) / k:.2f}"
            )
            g_desc = f"`{grpo[0]['args']}` x{k} ({grpo[0]['minutes']:.1f} min)"
            g_em = f"{before:.3f} -> {after:.3f} ({after - before:+.3f})"
        else:
            g_desc = g_em = valid = ""
        ws = r.get("warmup_min")
        lines.append(
            f"| {r['name']}: `{r['world_args']}` `{r['warmup']}` | "
            f"{'' if ws is None else f'{ws:.1f}'} | {r['sft_loss']:.2f} | {r['dev_em']:.3f} | "
            f"{r['dev_pass@8']:.3f} | {r['mixed_share']:.2f} | {r['train_em']:.3f} | "
            f"{g_desc} | {g_em} | {valid} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", help="row name; its files go to runs/calibrate/NAME")
    parser.add_argument("--world", default="", help="extra `common.tinyworld build` flags")
    parser.add_argument("--world-dir", default="", help="use this built world instead")
    parser.add_argument("--warmup", default="", help="warmup overrides (key=value ...)")
    parser.add_argument("--grpo", default=None, help="GRPO overrides; omit to skip GRPO")
    parser.add_argument("--grpo-tag", default="a", help="names the GRPO run folders")
    parser.add_argument("--grpo-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-questions", type=int, default=500)
    parser.add_argument("--n", type=int, default=8, help="samples per question for pass@n")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling for pass@n")
    parser.add_argument("--table", action="store_true", help="print the results table and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table())
        return
    if not args.name:
        parser.error("--name is required")
    calibrate(args)


if __name__ == "__main__":
    main()
