"""Rollout speed: ``VLLMEngine`` vs ``HFEngine`` on multi-turn agent rollouts and fixed-length text.

Agent case: ``run_agent`` on the tiny world, ``--questions`` train questions x ``--n`` samples,
the agent settings of ``common/configs/grpo_tiny.yaml`` (search_r1, 4 turns + a forced answer,
24 tokens a turn, top-3 BM25 documents), the warmed-up tiny agent when it exists (realistic
multi-turn rollouts), else the world's random model. Fixed-length case: ``--fixed-prompts``
prompts x 128 new tokens, no stop strings, eos ignored (vLLM ``ignore_eos``; HF with no eos id),
so both engines sample exactly the same number of tokens. Both engines live in one process and
run alternately, ``--repeats`` times each after a warm-up; the table gives medians. Generated
tokens = sampled tokens (the loss-mask sum), not inserted observations.

    .venv/bin/python benchmarks/bench_rollout.py [--repeats 3] [--write-readme]
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_result import Check, write_result
from rl_bench_common import (
    ROOT,
    command_line,
    load_average,
    machine_note,
    md_table,
    update_readme,
)

from common.config import load_config
from common.data import load_qa
from common.retrieval.bm25 import BM25Retriever
from common.rollout import HFEngine, SamplingConfig, build_prompt_ids, get_protocol, run_agent
from common.rollout.vllm_engine import VLLMEngine
from common.search_grpo import GRPOConfig

WARM = ROOT / "runs" / "warmup" / "tiny" / "model"


def agent_run(engine, tokenizer, retriever, questions, n, agent) -> dict[str, float]:
    t0 = time.perf_counter()
    trajs = run_agent(engine, tokenizer, retriever, questions, n, agent)
    secs = time.perf_counter() - t0
    return {
        "secs": secs,
        "rollouts": len(trajs),
        "tokens": sum(sum(t.loss_mask) for t in trajs),
        "searches": sum(t.num_searches for t in trajs) / len(trajs),
        "answered": sum(t.answer is not None for t in trajs) / len(trajs),
    }


def fixed_vllm(engine: VLLMEngine, prompts, max_tokens: int) -> dict[str, float]:
    """The engine's own sampling parameters with ``ignore_eos`` set (the interface has no such knob)."""
    params = engine._sampling_params(SamplingConfig(n=1, temperature=1.0, max_tokens=max_tokens))
    params.ignore_eos = True
    t0 = time.perf_counter()
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    secs = time.perf_counter() - t0
    return {"secs": secs, "tokens": sum(len(o.outputs[0].token_ids) for o in outs)}


def fixed_hf(engine: HFEngine, prompts, max_tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    outs = engine.generate(prompts, SamplingConfig(n=1, temperature=1.0, max_tokens=max_tokens))
    secs = time.perf_counter() - t0
    return {"secs": secs, "tokens": sum(len(o[0].token_ids) for o in outs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "common/configs/grpo_tiny.yaml"))
    parser.add_argument("--model", default="", help="default: warmed-up agent, else random")
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-batch", type=int, default=64, help="HFEngine batch size")
    parser.add_argument("--fixed-prompts", type=int, default=64)
    parser.add_argument("--fixed-tokens", type=int, default=128)
    parser.add_argument("--fixed-repeats", type=int, default=5)
    parser.add_argument("--write-readme", action="store_true")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(GRPOConfig, args.config, [])
    world = ROOT / cfg.assets.world
    model_path = Path(args.model) if args.model else (WARM if WARM.exists() else world / "model")
    load0 = load_average()
    engine_v = VLLMEngine(
        model_path,
        max_model_len=cfg.engine.max_model_len,
        kv_cache_bytes=cfg.engine.kv_cache_mib * 2**20,
        seed=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    engine_h = HFEngine(model, tokenizer, batch_size=args.hf_batch)
    retriever = BM25Retriever.from_corpus(world / "corpus.jsonl")
    questions = load_qa(world / "train.jsonl")[: args.questions]
    engines = {"vLLM (`VLLMEngine`)": engine_v, "HF (`HFEngine`)": engine_h}

    # warm-up: compile paths, allocate caches
    for eng in engines.values():
        run_agent(eng, tokenizer, retriever, questions[:4], 2, cfg.agent)
    agent_runs: dict[str, list[dict]] = {k: [] for k in engines}
    for r in range(args.repeats):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            res = agent_run(engines[name], tokenizer, retriever, questions, args.n, cfg.agent)
            agent_runs[name].append(res)
            print(f"[agent] {name} repeat {r}: {res}", flush=True)

    protocol = get_protocol(cfg.agent.protocol)
    prompts = [
        build_prompt_ids(tokenizer, protocol, q.question, cfg.agent.instruction)
        for q in load_qa(world / "train.jsonl")[: args.fixed_prompts]
    ]
    # HF: no eos id at all, so every row runs to max_tokens as vLLM's ignore_eos does
    model.generation_config.eos_token_id = None
    engine_h_fixed = HFEngine(model, tokenizer, batch_size=args.fixed_prompts)
    fixed = {"vLLM (`VLLMEngine`)": [], "HF (`HFEngine`)": []}
    fns = {
        "vLLM (`VLLMEngine`)": lambda: fixed_vllm(engine_v, prompts, args.fixed_tokens),
        "HF (`HFEngine`)": lambda: fixed_hf(engine_h_fixed, prompts, args.fixed_tokens),
    }
    for fn in fns.values():
        fn()
    for r in range(args.fixed_repeats):
        order = list(fns) if r % 2 == 0 else list(reversed(fns))
        for name in order:
            res = fns[name]()
            if res["tokens"] != args.fixed_prompts * args.fixed_tokens:
                raise RuntimeError(f"{name}: {res['tokens']} tokens, not fixed-length")
            fixed[name].append(res)
            print(f"[fixed] {name} repeat {r}: {res}", flush=True)
    load1 = load_average()

    rows = []
    base = None
    for name, runs in agent_runs.items():
        rps = statistics.median(x["rollouts"] / x["secs"] for x in runs)
        tps = statistics.median(x["tokens"] / x["secs"] for x in runs)
        base = base or (rps, tps)
        rows.append(
            [
                f"agent, {args.questions} q x {args.n}",
                name,
                f"{statistics.median(x['secs'] for x in runs):.2f}",
                f"{rps:,.1f}",
                f"{tps:,.0f}",
                f"{statistics.median(x['tokens'] for x in runs) / runs[0]['rollouts']:.1f}",
                f"{statistics.median(x['searches'] for x in runs):.2f}",
            ]
        )
    v_agent = statistics.median(
        x["rollouts"] / x["secs"] for x in agent_runs["vLLM (`VLLMEngine`)"]
    )
    h_agent = statistics.median(x["rollouts"] / x["secs"] for x in agent_runs["HF (`HFEngine`)"])
    for name, runs in fixed.items():
        rows.append(
            [
                f"fixed, {args.fixed_prompts} x {args.fixed_tokens} tokens",
                name,
                f"{statistics.median(x['secs'] for x in runs):.2f}",
                f"{statistics.median(args.fixed_prompts / x['secs'] for x in runs):,.1f}",
                f"{statistics.median(x['tokens'] / x['secs'] for x in runs):,.0f}",
                f"{args.fixed_tokens}",
                "-",
            ]
        )
    v_fixed = statistics.median(x["tokens"] / x["secs"] for x in fixed["vLLM (`VLLMEngine`)"])
    h_fixed = statistics.median(x["tokens"] / x["secs"] for x in fixed["HF (`HFEngine`)"])
    head = ["case", "engine", "median s", "rollouts/s", "sampled tokens/s", "tokens/rollout",
            "searches/rollout"]  # fmt: skip
    table = md_table(head, rows)
    note = (
        f"vLLM / HF: agent rollouts {v_agent / h_agent:.2f}x, fixed-length tokens/s "
        f"{v_fixed / h_fixed:.2f}x. Model `{model_path.relative_to(ROOT) if model_path.is_relative_to(ROOT) else model_path}` "
        f"(Qwen3, 2 layers, hidden 128, vocab 2048, float32); agent = `agent:` of "
        f"`{Path(args.config).name}`, vLLM KV cache {cfg.engine.kv_cache_mib} MiB, prefix caching on, "
        f"HFEngine batch {args.hf_batch} (fixed case: one batch of {args.fixed_prompts}); "
        f"median of {args.repeats} (agent) and {args.fixed_repeats} (fixed) alternating runs after "
        f"a warm-up; {machine_note()}; load average {load0} at start, {load1} at end.\n"
        f"{command_line()}"
    )
    body = f"### Rollouts: vLLM vs HF engine\n\n{table}\n\n{note}"
    print(body)
    checks = [
        Check(f"agent rollouts/s, vLLM vs HF ({args.questions} q x {args.n})", v_agent / h_agent,
              ">=", 2.0, "x"),
        Check(f"fixed-length tokens/s, vLLM vs HF ({args.fixed_prompts} x {args.fixed_tokens})",
              v_fixed / h_fixed, unit="x"),
    ]  # fmt: skip
    write_result("bench_rollout", checks, note.splitlines()[0])
    if args.write_readme:
        update_readme("bench_rollout", body)


if __name__ == "__main__":
    main()
