"""The policy update with zero-advantage rows left out of its forward
(``loss.skip_zero_advantage``) against the forward of every row, side by side in one process,
on the same batch.

    python benchmarks/bench_zero_advantage.py [--b 4] [--g 8] [--mixed 1]

The batch is a ``SCALE=smol`` search agent's step (``eviback/configs/smol.yaml``,
``common/configs/grpo_smol.yaml``): B questions x G trajectories of a 75-token prompt and 300 to
``--response-tokens`` tokens after it, one micro-batch a group. Exact match rewards: ``--mixed``
groups have right and wrong answers; the rest are all-zero, GRPO advantage 0 (85% of groups after
the format warmup, benchmarks/RESULTS.md). The model has SmolLM2-135M-Instruct's shape in float32
(``bench_shared_prompt.SMOL_SHAPE``). Two engines from the same weights take turns,
``--repeats`` times each; their first updates' statistics are compared (the same step, up to
float rounding). Prints each one's median time, the speed-up and the rows and tokens forwarded.
"""

from __future__ import annotations

import argparse

import torch
from bench_result import Check, write_result
from bench_shared_prompt import SMOL_SHAPE, batch, time_updates


def main(argv: list[str] | None = None) -> None:
    import transformers

    from common.rl import group_normalized_advantages
    from common.rl_loop import LossConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--b", type=int, default=4, help="questions (groups) a step")
    p.add_argument("--g", type=int, default=8, help="trajectories a question (one micro-batch)")
    p.add_argument("--mixed", type=int, default=1, help="groups with right and wrong answers")
    p.add_argument("--prompt-tokens", type=int, default=75)
    p.add_argument("--response-tokens", type=int, default=600)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if not 0 < args.mixed <= args.b:
        p.error(f"--mixed must be in 1..--b ({args.b}), got {args.mixed}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOL_SHAPE)).float()
    longest = args.response_tokens
    trajs = batch(args.b, args.g, args.prompt_tokens, longest, SMOL_SHAPE["vocab_size"], seed=1,
                  shortest=longest // 2)  # fmt: skip
    rewards = torch.zeros(len(trajs))
    for q in range(args.mixed):  # a quarter of each mixed group right
        rewards[q * args.g : q * args.g + max(1, args.g // 4)] = 1.0
    advantages = group_normalized_advantages(rewards, [t.group_id for t in trajs])
    configs = {
        name: LossConfig(micro_batch_size=args.g, skip_zero_advantage=name == "skip zero")
        for name in ("every row", "skip zero")
    }
    med, first = time_updates(model, trajs, advantages, configs, args.b, args.repeats)
    speedup = med["every row"] / med["skip zero"]
    whole, skip = first["every row"], first["skip zero"]
    dnorm = abs(skip["grad_norm"] - whole["grad_norm"]) / whole["grad_norm"]
    setting = (
        f"SmolLM2-135M shape, random weights, fp32, {args.threads} threads; {args.b} questions x "
        f"{args.g} trajectories ({args.mixed} group(s) mixed, the rest all-zero), prompt "
        f"{args.prompt_tokens} tokens, {longest // 2}-{longest} after it; median of {args.repeats}"
    )
    print(f"setting: {setting}\n")
    print("| update | seconds (median) | rows trained | tokens forwarded | loss | grad norm |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, s in first.items():
        print(f"| {k} | {med[k]:.2f} | {s['update_rows']} | {s['tokens/update_forwarded']:,} "
              f"| {s['loss']:.6f} | {s['grad_norm']:.6f} |")  # fmt: skip
    print(f"\nspeed-up {speedup:.2f}x; first update's grad norm differs by {dnorm:.1e} (relative)")
    write_result(
        "bench_zero_advantage",
        [
            Check("update, zero-advantage rows skipped vs every row", speedup, ">=", 1.5, "x"),
            Check("rows trained, every row / skip", whole["update_rows"] / skip["update_rows"]),
            Check("first update's grad norm, relative difference", dnorm, "<=", 1e-4),
        ],
        setting,
    )


if __name__ == "__main__":
    main()
