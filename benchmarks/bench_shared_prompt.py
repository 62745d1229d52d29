"""The policy update with each group's prompt forwarded once (``loss.share_prompt``) against the
whole forward of every row, side by side in one process, on the same batch.

    python benchmarks/bench_shared_prompt.py [--prompt-tokens 279] [--response-tokens 32]

The model has SmolLM2-135M-Instruct's shape (``--model`` loads a model folder instead; the
weights do not change the time), in float32 on the CPU as ``SCALE=smol`` trains it. The batch is
``cer/configs/smol.yaml``'s: B prompts x G responses, the prompts' length the median of its
training prompts (279 tokens), responses of 8 to ``--response-tokens`` sampled tokens, one
micro-batch a group. Two training engines from the same weights take turns, ``--repeats`` times
each; the first turn's statistics are compared (the same update, up to float rounding). Prints
the median update time of each, the speed-up and the tokens each forwarded.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from bench_result import Check, write_result

# SmolLM2-135M-Instruct's config.json (the shape make smol builds)
SMOL_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
    rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
)  # fmt: skip


def batch(
    b: int, g: int, prompt: int, longest: int, vocab: int, seed: int, shortest: int = 8
) -> list:
    """B groups of G trajectories: one random prompt a group, responses of shortest..longest
    tokens."""
    from common.rollout.trajectory import Trajectory

    gen = torch.Generator().manual_seed(seed)
    out = []
    for q in range(b):
        ids = torch.randint(0, vocab, (prompt,), generator=gen).tolist()
        for i in range(g):
            r = int(torch.randint(min(shortest, longest), longest + 1, (1,), generator=gen))
            t = Trajectory(f"q{q}", i, "q", "q", ["a"], list(ids))
            t.append(torch.randint(0, vocab, (r,), generator=gen).tolist(), sampled=True,
                     logprobs=[-1.0] * r)  # fmt: skip
            out.append(t)
    return out


def time_updates(
    model, trajs: list, advantages, configs: dict, grad_accum: int, repeats: int
) -> tuple[dict[str, float], dict[str, dict]]:
    """``policy_update`` under each named ``LossConfig``, each on its own engine from the same
    weights, taking turns ``repeats`` times: each one's median seconds and first statistics."""
    from common.rl_loop import policy_update
    from common.train import TrainConfig, TrainEngine

    train_cfg = TrainConfig(lr=5e-6, grad_accum=grad_accum)
    names = list(configs)
    engines = {n: TrainEngine(copy.deepcopy(model) if n != names[-1] else model, train_cfg)
               for n in names}  # fmt: skip
    times: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, dict] = {}
    for _ in range(repeats):
        for name, engine in engines.items():
            t0 = time.perf_counter()
            stats = policy_update(engine, trajs, advantages, configs[name], pad_id=0)
            times[name].append(time.perf_counter() - t0)
            first.setdefault(name, stats)
    return {n: statistics.median(v) for n, v in times.items()}, first


def main(argv: list[str] | None = None) -> None:
    import transformers

    from common.rl_loop import LossConfig

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="", help="a model folder (default: SmolLM2's shape, random)")
    p.add_argument("--b", type=int, default=4, help="prompts (groups) a step")
    p.add_argument("--g", type=int, default=8, help="responses a prompt (one micro-batch)")
    p.add_argument("--prompt-tokens", type=int, default=279)
    p.add_argument("--response-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOL_SHAPE)).float()
    vocab = model.config.vocab_size
    trajs = batch(args.b, args.g, args.prompt_tokens, args.response_tokens, vocab, seed=1)
    advantages = torch.randn(len(trajs), generator=torch.Generator().manual_seed(2))
    configs = {
        name: LossConfig(micro_batch_size=args.g, share_prompt=name == "shared")
        for name in ("whole", "shared")
    }
    med, first = time_updates(model, trajs, advantages, configs, args.b, args.repeats)
    speedup = med["whole"] / med["shared"]
    dloss = abs(first["shared"]["loss"] - first["whole"]["loss"])
    dnorm = abs(first["shared"]["grad_norm"] - first["whole"]["grad_norm"])
    tokens = {k: first[k]["tokens/update_forwarded"] for k in configs}
    setting = (
        f"{'SmolLM2-135M shape, random weights' if not args.model else args.model}, fp32, "
        f"{args.threads} threads; {args.b} prompts x {args.g} responses, prompt "
        f"{args.prompt_tokens} tokens, responses 8-{args.response_tokens}; median of "
        f"{args.repeats}"
    )
    print(f"setting: {setting}\n")
    print("| update | seconds (median) | tokens forwarded | loss | grad norm |")
    print("|---|---:|---:|---:|---:|")
    for k in configs:
        print(f"| {k} | {med[k]:.2f} | {tokens[k]:,} | {first[k]['loss']:.6f} "
              f"| {first[k]['grad_norm']:.6f} |")  # fmt: skip
    print(
        f"\nspeed-up {speedup:.2f}x; first update |d loss| {dloss:.1e}, |d grad norm| {dnorm:.1e}"
    )
    write_result(
        "bench_shared_prompt",
        [
            Check("update, shared prompt vs whole rows", speedup, ">=", 2.0, "x"),
            Check("tokens forwarded, whole / shared", tokens["whole"] / tokens["shared"]),
            Check("first update's |d grad norm|", dnorm, "<=", 1e-4),
        ],
        setting,
    )


if __name__ == "__main__":
    main()
