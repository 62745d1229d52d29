"""Step-time overhead of CER over exact match, on the same sampled batch, in one process.

    python benchmarks/bench_cer_step.py --model runs/cer/tiny/warmup/model --task runs/cer/tiny/task

Samples one tiny step (B x G, HF engine keeping its caches, as the trainer does), then times
alternately, ``--repeats`` times: the reward with ``exact`` (which also computes ``rule``, the
accuracy), the reward with ``cer``, and the rest of a step (generation, the clipped update on a
copy of the model). math-verify's parse caches are emptied before each reward. Prints medians and
the overhead ``(t_cer - t_exact) / t_step(exact)``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from bench_result import Check, write_result


def clear_verifier_caches() -> None:
    """Empty math-verify's parse caches: whichever reward ran second would find the answers
    already parsed (the rule verifier runs with every reward type: it is the accuracy)."""
    import math_verify.parser

    for value in vars(math_verify.parser).values():
        if callable(getattr(value, "cache_clear", None)):
            value.cache_clear()


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cer.config import LossConfig
    from cer.evaluate import load_problems
    from cer.rewards.groups import group_rewards
    from cer.rewards.scoring import hf_prefix_scorer
    from cer.rollout import sample_groups
    from common.rl import rloo_advantages
    from common.rl_loop import policy_update
    from common.rollout import HFEngine
    from common.rollout.engine import SamplingConfig
    from common.train import TrainConfig, TrainEngine

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="runs/cer/tiny/warmup/model")
    p.add_argument("--task", default="runs/cer/tiny/task")
    p.add_argument("--b", type=int, default=8)
    p.add_argument("--g", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=6, help="even: each reward first as often")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--scorer-batch-size", type=int, default=16, help="tiny.yaml's value")
    p.add_argument(
        "--no-kv-reuse", action="store_true", help="score without the generation's caches"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    examples, prompts = load_problems(f"{args.task}/train.jsonl", tok, 256)
    engine = HFEngine(model, tok, keep_kv=not args.no_kv_reuse)  # as the trainer samples
    params = SamplingConfig(n=args.g, max_tokens=args.max_tokens)
    scorer = hf_prefix_scorer(model, args.scorer_batch_size)
    times: dict[str, list[float]] = {"generate": [], "exact": [], "cer": [], "update": []}
    for r in range(args.repeats):
        sl = slice(r * args.b, (r + 1) * args.b)
        t0 = time.perf_counter()
        groups = sample_groups(engine, tok, examples[sl], prompts[sl], params)
        times["generate"].append(time.perf_counter() - t0)
        for kind in ("exact", "cer") if r % 2 else ("cer", "exact"):
            clear_verifier_caches()  # each reward parses the answers afresh, as in a step
            t0 = time.perf_counter()
            rewards, _ = group_rewards([kind], groups, scorer, tok)
            times[kind].append(time.perf_counter() - t0)
        trajs = [t for g in groups for t in g.trajs]
        adv = rloo_advantages(rewards["exact"], [t.group_id for t in trajs])
        train = TrainEngine(copy.deepcopy(model), TrainConfig(lr=1e-4, grad_accum=2))
        t0 = time.perf_counter()
        policy_update(
            train, trajs, adv, LossConfig(micro_batch_size=len(trajs) // 2), tok.pad_token_id
        )
        times["update"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    step_exact = med["generate"] + med["exact"] + med["update"]
    for k, v in med.items():
        print(f"{k:9s} median {v:.3f} s")
    overhead = 100 * (med["cer"] - med["exact"]) / step_exact
    setting = f"B={args.b}, G={args.g}, {args.repeats} repeats, model {args.model}"
    write_result(
        "bench_cer_step",
        [Check("CER step time over exact match", overhead, "<=", 10.0, "%")],
        setting,
    )
    print(
        f"step (exact) {step_exact:.3f} s; CER adds {med['cer'] - med['exact']:.3f} s = "
        f"{100 * (med['cer'] - med['exact']) / step_exact:+.1f}% (B={args.b}, G={args.g})"
    )


if __name__ == "__main__":
    main()
