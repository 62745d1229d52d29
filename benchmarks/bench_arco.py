"""ARCO on the tiny setting: memory of one shared base against full copies, where a step goes, and
the batch's rubrics in one engine call against one call per turn.

    .venv/bin/python benchmarks/bench_arco.py memory              # peak RSS, two subprocesses
    .venv/bin/python benchmarks/bench_arco.py breakdown RUN_DIR [RUN_DIR ...]  # time/* keys;
        # two runs (e.g. rl.mu_single_forward=true and false): their median steps side by side
    .venv/bin/python benchmarks/bench_arco.py calls [--repeats 3] # rubric generation, 1 vs per turn
    .venv/bin/python benchmarks/bench_arco.py shared [--dense-steps 5] [--warmup-dir DIR]
        # dense steps with rubric.shared_prefix true and false, one run after the other
    (add --write-readme to put the table into benchmarks/RESULTS.md)

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
import shutil
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
    from arco.trainer import push_adapters
    from common.config import load_config
    from common.rl_loop import build_engine
    from common.rollout.vllm_engine import VLLMEngine

    cfg = load_config(ArcoConfig, str(CONFIG), [])
    if mode == "shared":
        model = build_arco_model(cfg.assets.model, cfg.lora.as_peft(), cfg.rubric.k)
        engine = build_engine(cfg.engine, cfg.assets.model, model.lm, None, 0, cfg.lora.r)
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
    from arco.trainer import push_adapters
    from common.config import load_config
    from common.data import load_qa
    from common.rl_loop import build_engine
    from common.rollout import run_agent

    cfg = load_config(ArcoConfig, str(CONFIG), [])
    init = cfg.warmup_dir if (Path(cfg.warmup_dir) / "arco.json").is_file() else None
    tok = AutoTokenizer.from_pretrained(cfg.assets.model)
    model = build_arco_model(cfg.assets.model, cfg.lora.as_peft(), cfg.rubric.k, init)
    engine = build_engine(cfg.engine, cfg.assets.model, model.lm, tok, 0, cfg.lora.r)
    push_adapters(engine, model)
    retriever, agent = build_environment(cfg.env, cfg.agent, cfg.assets.corpus)
    qs = load_qa(cfg.assets.train)[: cfg.rl.dense_questions]
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


SHARED_DIR = ROOT / "runs" / "bench" / "arco_shared"


def shared_prefix(
    dense_steps: int, warmup_dir: Path, write: bool, model: Path | None = None
) -> None:
    """ARCO's dense step with μ's rows as one trunk a trajectory (``rubric.shared_prefix``)
    and one row a step, each a fresh ``arco train`` of ``dense_steps`` dense steps (no sparse
    step, no evaluation) from the same warmup, seed and questions, one after the other; the
    median step of each with its first step left out, and the μ update's share of it.
    ``model``: the backbone (``assets.model``) when the warmup was built on another one."""
    if not (warmup_dir / "arco.json").is_file():
        raise SystemExit(
            f"{warmup_dir}/arco.json missing: run `make warmup` and `python -m arco warmup "
            f"--config {CONFIG.relative_to(ROOT)} warmup_dir={warmup_dir}` first"
        )
    medians: dict[str, dict[str, float]] = {}
    for arm, flag in (("shared", "true"), ("unshared", "false")):
        run_dir = SHARED_DIR / arm
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time
        over = [
            f"run_dir={run_dir}", f"warmup_dir={warmup_dir}", "rl.sparse_steps=0",
            f"rl.dense_steps={dense_steps}", "eval_every=0", "resume=false",
            f"rubric.shared_prefix={flag}", *([f"assets.model={model}"] if model else []),
        ]  # fmt: skip
        cmd = [sys.executable, "-m", "arco", "train", "--config", str(CONFIG), *over]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            raise SystemExit(f"{arm}: arco train failed:\n{out.stderr[-3000:]}")
        print(f"[bench_arco] {arm}: {time.perf_counter() - t0:.0f} s", flush=True)
        steps = [r for r in _step_rows(run_dir) if r.get("phase_dense") == 1.0][1:]
        if not steps:
            raise SystemExit(f"{run_dir}: fewer than two dense steps")
        medians[arm] = {
            part: statistics.median(r.get(f"time/{part}", 0.0) for r in steps)
            for part in (*PARTS, "step")
        }
        medians[arm]["steps"] = len(steps)
        medians[arm]["load_after"] = os.getloadavg()[0]  # the machine is shared: say how much
    sh, un = medians["shared"], medians["unshared"]
    ratio = sh["step"] / un["step"]
    rows = [
        [
            part,
            f"{sh[part]:.2f}",
            f"{un[part]:.2f}",
            f"{sh[part] / un[part]:.2f}" if un[part] else "-",
        ]
        for part in (*PARTS, "step")
    ]
    for arm in (sh, un):
        arm["mu_update_share"] = arm["mu_update"] / arm["step"]
    rows.append(
        ["μ update's share of the step", f"{sh['mu_update_share']:.1%}",
         f"{un['mu_update_share']:.1%}", ""]
    )  # fmt: skip
    table = md_table(
        ["dense step part (median s)", "shared_prefix=true", "shared_prefix=false", "ratio"], rows
    )
    setting = (
        f"tiny.yaml, {dense_steps} dense steps of {_dense_questions()} trajectories from "
        f"{warmup_dir}, median of the last {int(sh['steps'])}; load average after each run "
        f"{sh['load_after']:.1f} (shared) and {un['load_after']:.1f} (unshared); {machine_note()}"
    )
    body = (
        f"### ARCO dense step: shared-prefix trunk vs one row a step\n\n{command_line()}: "
        f"{setting}.\n\n{table}"
    )
    print(body)
    check = Check("ARCO dense step, rubric.shared_prefix true / false", ratio, "<=", 0.6)
    path = write_result("bench_arco", [check], setting)
    record = json.loads(path.read_text())
    record |= {
        "dense_step_s_shared": sh["step"],
        "dense_step_s_unshared": un["step"],
        "dense_step_ratio": ratio,
        "mu_update_share_shared": sh["mu_update_share"],
        "mu_update_share_unshared": un["mu_update_share"],
        "parts_shared": sh,
        "parts_unshared": un,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    if write:
        update_readme("bench_arco:shared_prefix", body)


def _dense_questions() -> int:
    from arco.config import ArcoConfig
    from common.config import load_config

    return load_config(ArcoConfig, str(CONFIG), []).rl.dense_questions


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
    p = sub.add_parser("shared")
    p.add_argument("--dense-steps", type=int, default=5)
    p.add_argument("--warmup-dir", type=Path, default=SHARED_DIR / "warmup")
    p.add_argument("--model", type=Path, default=None, help="assets.model (default: tiny.yaml's)")
    p.add_argument("--write-readme", action="store_true")
    sub.add_parser("hold").add_argument("mode", choices=("shared", "copies"))
    args = parser.parse_args()
    if args.what == "hold":
        hold(args.mode)
    elif args.what == "memory":
        memory(args.write_readme)
    elif args.what == "shared":
        model = args.model.resolve() if args.model else None
        shared_prefix(args.dense_steps, args.warmup_dir.resolve(), args.write_readme, model)
    elif args.what == "breakdown":
        for d in args.run_dir:
            breakdown(d, args.write_readme and len(args.run_dir) == 1)
        if len(args.run_dir) > 1:
            print(compare(args.run_dir))
    else:
        calls(args.repeats, args.write_readme)


if __name__ == "__main__":
    main()
