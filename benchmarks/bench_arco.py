"""ARCO on the tiny setting: memory of one shared base against full copies, where a step goes, and
the batch's rubrics in one engine call against one call per turn.

    .venv/bin/python benchmarks/bench_arco.py memory              # peak RSS, two subprocesses
    .venv/bin/python benchmarks/bench_arco.py breakdown RUN_DIR [RUN_DIR ...]  # time/* keys;
        # two runs (e.g. rl.mu_single_forward=true and false): their median steps side by side
    .venv/bin/python benchmarks/bench_arco.py calls [--repeats 3] # rubric generation, 1 vs per turn
    (add --write-readme to put the table into benchmarks/README.md)

memory: each mode in a fresh process. ``shared`` builds what the trainer holds (one base, the
policy/rubric adapters and their frozen references, the head, a vLLM engine serving both
adapters); ``copies`` holds what the release holds (π, π_ref, μ, μ_ref as four full models and a
plain engine). Also the bytes of both layouts for Qwen3-4B, computed from its shapes.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_result import Check, write_result
from rl_bench_common import ROOT, command_line, machine_note, md_table, update_readme

CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
PARTS = ("rollout", "rubric_generation", "scoring", "pi_update", "mu_update", "push")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def hold(mode: str) -> None:
    """Build one layout, print its peak RSS (the subprocess side of ``memory``)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    from arco.config import ArcoConfig
    from arco.rubric_model import build_arco_model
    from arco.trainer import build_engine, push_adapters
    from common.config import load_config
    from common.rollout.vllm_engine import VLLMEngine

    cfg = load_config(ArcoConfig, str(CONFIG), [])
    if mode == "shared":
        model = build_arco_model(cfg.assets.model, cfg.lora.as_peft(), cfg.rubric.k)
        engine = build_engine(cfg, model, None, seed=0)
        push_adapters(engine, model)
        kept = [model, engine]
    else:
        base = AutoModelForCausalLM.from_pretrained(cfg.assets.model, dtype=torch.float32)
        kept = [base] + [copy.deepcopy(base) for _ in range(3)]
        kept.append(
            VLLMEngine(
                cfg.assets.model,
                max_model_len=cfg.engine.max_model_len,
                kv_cache_bytes=cfg.engine.kv_cache_mib * 2**20,
            )
        )
    params = sum(p.numel() for m in kept if hasattr(m, "parameters") for p in m.parameters())
    print(json.dumps({"mode": mode, "peak_rss_mib": _peak_rss_mib(), "params": params}))


def qwen3_4b_bytes() -> list[list[str]]:
    """Weights of the release's layout (four bf16 copies) and ours (one base + four r-8 q/v
    adapters in bf16 + the fp32 head), from Qwen3-4B's shapes."""
    hidden, layers, heads, kv, head_dim, ffn, vocab = 2560, 36, 32, 8, 128, 9728, 151936
    attn = hidden * heads * head_dim + 2 * hidden * kv * head_dim + heads * head_dim * hidden
    per_layer = attn + 3 * hidden * ffn + 2 * hidden + 2 * head_dim  # + norms
    base = layers * per_layer + vocab * hidden + hidden  # tied embeddings
    r = 8
    adapter = layers * r * ((hidden + heads * head_dim) + (hidden + kv * head_dim))
    head = hidden * 512 + 512 + 512 * 128 + 128 + 128 * 3 + 3
    gb = 1e9
    return [
        ["release: π, π_ref, μ, μ_ref as full bf16 copies", f"{4 * base * 2 / gb:.2f} GB"],
        [
            "ours: one bf16 base + 4 LoRA adapters (bf16) + fp32 head",
            f"{(base * 2 + 4 * adapter * 2 + head * 4) / gb:.2f} GB",
        ],
        [
            "(base parameters; one adapter; head)",
            f"{base / 1e9:.3f}B; {adapter / 1e6:.2f}M; {head / 1e6:.2f}M",
        ],
    ]


def memory(write: bool) -> None:
    rows, rss = [], {}
    for mode in ("shared", "copies"):
        out = subprocess.run(
            [sys.executable, __file__, "hold", mode], capture_output=True, text=True, cwd=ROOT
        )
        if out.returncode:
            raise SystemExit(f"hold {mode} failed:\n{out.stderr[-3000:]}")
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append([mode, f"{rec['params']:,}", f"{rec['peak_rss_mib']:.0f}"])
        rss[mode] = rec["peak_rss_mib"]
    table = md_table(
        ["layout (tiny model + vLLM engine)", "parameters held", "peak RSS (MiB)"], rows
    )
    table += "\n\n" + md_table(["Qwen3-4B layout", "weights"], qwen3_4b_bytes())
    body = f"### ARCO memory\n\n{command_line()}; {machine_note()}.\n\n{table}"
    print(body)
    check = Check("ARCO peak RSS, shared base vs full copies (tiny)", rss["shared"] / rss["copies"])
    write_result("bench_arco.memory", [check], f"{command_line()}; {machine_note()}")
    if write:
        update_readme("bench_arco:memory", body)


def _step_rows(run_dir: Path) -> list[dict]:
    rows = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").open() if '"time/step"' in line
    ]
    if not rows:
        raise SystemExit(f"{run_dir}/metrics.jsonl: no step rows")
    return rows


def median_steps(run_dir: Path) -> dict[str, float]:
    """A run's median step time per phase (its first step of each phase left out: warm-up)."""
    rows = _step_rows(run_dir)
    out = {}
    for phase, dense in (("sparse", 0.0), ("dense", 1.0)):
        steps = [r["time/step"] for r in rows if r.get("phase_dense") == dense][1:]
        if steps:
            out[phase] = statistics.median(steps)
    return out


def compare(run_dirs: list[Path]) -> str:
    """Median step per phase of each run, and each run's ratio to the first's."""
    base = median_steps(run_dirs[0])
    out = []
    for d in run_dirs:
        for phase, t in median_steps(d).items():
            ratio = t / base[phase] if phase in base else float("nan")
            out.append([str(d), phase, f"{t:.2f}", f"{ratio:.2f}"])
    return md_table(["run", "phase", "median step s", "ratio to the first"], out)


def breakdown(run_dir: Path, write: bool) -> None:
    rows = _step_rows(run_dir)
    out = []
    for phase, dense in (("sparse", 0.0), ("dense", 1.0)):
        steps = [r for r in rows if r.get("phase_dense") == dense][1:]  # first one warms up
        if not steps:
            continue
        step = statistics.median(r["time/step"] for r in steps)
        for part in PARTS:
            t = statistics.median(r.get(f"time/{part}", 0.0) for r in steps)
            out.append([phase, part, f"{t:.2f}", f"{100 * t / step:.1f}%"])
        rubric = sum(
            statistics.median(r.get(f"time/{p}", 0.0) for r in steps)
            for p in ("rubric_generation", "scoring", "mu_update")
        )
        out.append(
            [
                phase,
                "**rubric (generation + scoring + μ update; no scoring part with "
                "rl.mu_single_forward)**",
                f"{rubric:.2f}",
                f"{100 * rubric / step:.1f}%",
            ]
        )
        out.append([phase, "step", f"{step:.2f}", "100%"])
    table = md_table(["phase", "part", "median s", "share"], out)
    body = f"### ARCO step breakdown\n\n{command_line()} ({run_dir}); {machine_note()}.\n\n{table}"
    print(body)
    if write:
        update_readme("bench_arco:breakdown", body)


def calls(repeats: int, write: bool) -> None:
    """The rubric prompts of one dense batch: one ``generate`` call for all steps against one call
    per turn (all trajectories' step t together, as a rubric written inside the rollout loop)."""
    from transformers import AutoTokenizer

    from arco.config import ArcoConfig
    from arco.environment import build_environment
    from arco.rubric_model import build_arco_model
    from arco.rubrics import rubric_items, write_criteria
    from arco.steps import episode_from_trajectory
    from arco.trainer import build_engine, push_adapters
    from common.config import load_config
    from common.data import load_qa
    from common.rollout import run_agent

    cfg = load_config(ArcoConfig, str(CONFIG), [])
    init = cfg.warmup_dir if (Path(cfg.warmup_dir) / "arco.json").is_file() else None
    tok = AutoTokenizer.from_pretrained(cfg.assets.model)
    model = build_arco_model(cfg.assets.model, cfg.lora.as_peft(), cfg.rubric.k, init)
    engine = build_engine(cfg, model, tok, seed=0)
    push_adapters(engine, model)
    retriever, agent = build_environment(cfg.env, cfg.agent, cfg.assets.corpus)
    qs = load_qa(cfg.assets.train_file)[: cfg.rl.dense_questions]
    trajs = run_agent(engine, tok, retriever, qs, 1, agent, adapter="policy", seed=0)
    eps = [episode_from_trajectory(t, tok, cfg.env.max_searches) for t in trajs]

    def items():
        return rubric_items(
            eps,
            tok,
            cfg.rubric.k,
            cfg.rubric.prefix,
            cfg.rubric.max_obs_chars,
            **cfg.rubric.templates(),
        )

    def one_call() -> float:
        batch = items()
        t0 = time.perf_counter()
        write_criteria(engine, batch, cfg.rubric.k, cfg.rubric.max_new_tokens, tok.eos_token_id)
        return time.perf_counter() - t0

    def per_turn() -> float:
        batch = items()
        t0 = time.perf_counter()
        for t in range(max(it.step for it in batch) + 1):
            turn = [it for it in batch if it.step == t]
            write_criteria(engine, turn, cfg.rubric.k, cfg.rubric.max_new_tokens, tok.eos_token_id)
        return time.perf_counter() - t0

    one_call(), per_turn()  # warm-up
    times = {"one call": [], "one call per turn": []}
    for _ in range(repeats):  # alternated, so drift on a shared machine hits both
        times["one call"].append(one_call())
        times["one call per turn"].append(per_turn())
    base = statistics.median(times["one call per turn"])
    n_items = len(items())
    rows = [
        [name, str(n_items), f"{statistics.median(ts):.2f}", f"{base / statistics.median(ts):.2f}x"]
        for name, ts in times.items()
    ]
    table = md_table(["rubric generation", "rubrics", "median s", "speed-up"], rows)
    body = (
        f"### ARCO rubric generation: one call vs per turn\n\n{command_line()}: "
        f"{len(trajs)} trajectories, {cfg.rubric.max_new_tokens} new tokens at most, greedy, "
        f"median of {repeats} alternated repeats; {machine_note()}.\n\n{table}"
    )
    print(body)
    speedup = base / statistics.median(times["one call"])
    check = Check("ARCO rubric generation, one call vs one per turn", speedup, unit="x")
    write_result("bench_arco.calls", [check], f"{len(trajs)} trajectories, {n_items} rubrics")
    if write:
        update_readme("bench_arco:calls", body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("memory").add_argument("--write-readme", action="store_true")
    p = sub.add_parser("breakdown")
    p.add_argument("run_dir", type=Path, nargs="+")
    p.add_argument("--write-readme", action="store_true")
    p = sub.add_parser("calls")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--write-readme", action="store_true")
    sub.add_parser("hold").add_argument("mode", choices=("shared", "copies"))
    args = parser.parse_args()
    if args.what == "hold":
        hold(args.mode)
    elif args.what == "memory":
        memory(args.write_readme)
    elif args.what == "breakdown":
        for d in args.run_dir:
            breakdown(d, args.write_readme and len(args.run_dir) == 1)
        if len(args.run_dir) > 1:
            print(compare(args.run_dir))
    else:
        calls(args.repeats, args.write_readme)


if __name__ == "__main__":
    main()
