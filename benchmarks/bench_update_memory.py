"""Peak memory of one `policy_update` at Qwen3's 151,936-token vocabulary: the whole-logits path
of the unchunked path against the chunked head (`common.rl.forward_logprobs`).

A tiny random Qwen3 (tied embeddings, 1 layer, hidden 64) so that what fills memory is the
vocabulary-sized tensors, which do not shrink with the model. Each (B, T, path) runs in a fresh
process on CPU in fp32 with a k3 KL to the reference (kl_coef > 0); the reported figure is the
process's peak RSS during the update minus its peak before it (model, engine and batch built).

    python benchmarks/bench_update_memory.py [--cases 2x256,2x1024,4x512] [--chunk 1024]
    python benchmarks/bench_update_memory.py --paper

``--paper``: each paper config's own update shape (EviBack's and CER's, read with their config
loaders: ``loss.micro_batch_size`` sequences of the longest length the config allows,
``agent.max_context`` or ``max_prompt_tokens + max_response_tokens``, at its ``kl_coef`` and
``logprob_chunk``), the chunked head only: the whole-logits path would need about four times
the whole fp32 logits (measured below at 2 x 1,024: 4,775 MiB for 1,187 MiB), tens of GB.

Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VOCAB = 151_936


def old_forward_logprobs(forward, input_ids, attention_mask, chunk_size=4096, temperature=1.0):
    """The unchunked path: the model's whole logits [B, T, V], log-softmax in chunks."""
    from common.rl import logprobs_from_logits

    logits = forward(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    return logprobs_from_logits(logits[:, :-1] / temperature, input_ids[:, 1:], chunk_size)


def old_reference_logprobs(self, input_ids, attention_mask=None, chunk_size=1024):
    """The unchunked path: a whole fp32 log-softmax of the reference's logits."""
    import torch

    with torch.no_grad():
        logits = self.logits(input_ids, attention_mask)
        logp = torch.log_softmax(logits[:, :-1].float(), -1)
        return logp.gather(-1, input_ids[:, 1:, None])[..., 0]


def one(batch: int, length: int, path: str, chunk: int, kl_coef: float = 0.1) -> dict[str, float]:
    """One update in this process: {"peak_mib": growth of peak RSS, "seconds": wall time}."""
    import torch
    import transformers

    import common.rl_loop as rl_loop
    from common.rollout.trajectory import Trajectory
    from common.train import ReferenceModel, TrainConfig, TrainEngine

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
    )
    engine = TrainEngine(
        transformers.Qwen3ForCausalLM(config), TrainConfig(lr=1e-5), reference=kl_coef > 0
    )
    if path == "old":
        rl_loop.forward_logprobs = old_forward_logprobs
        ReferenceModel.logprobs = old_reference_logprobs
    g = torch.Generator().manual_seed(1)
    trajs = []
    for i in range(batch):
        t = Trajectory(
            "g", i, "q", "q", ["a"], torch.randint(0, VOCAB, (32,), generator=g).tolist()
        )
        n = length - 32
        t.append(torch.randint(0, VOCAB, (n,), generator=g).tolist(), True, [0.0] * n)
        trajs.append(t)
    cfg = rl_loop.LossConfig(micro_batch_size=batch, kl_coef=kl_coef, logprob_chunk=chunk)
    advantages = torch.randn(batch, generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    rl_loop.policy_update(engine, trajs, advantages, cfg, pad_id=0)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": (after - before) / 1024, "seconds": seconds}


def paper_shapes() -> list[dict]:
    """One row per distinct update shape of the EviBack and CER paper configs."""
    from cer.config import CERConfig
    from common.config import load_config
    from eviback.config import EviBackConfig

    shapes: dict[tuple, dict] = {}
    for path in sorted((ROOT / "eviback" / "configs").glob("qwen3_*.yaml")):
        cfg = load_config(EviBackConfig, path)
        key = (cfg.loss.micro_batch_size, cfg.agent.max_context, cfg.loss.kl_coef,
               cfg.loss.logprob_chunk)  # fmt: skip
        shapes.setdefault(key, {"configs": []})["configs"].append(f"eviback/{path.stem}")
    for path in sorted((ROOT / "cer" / "configs").glob("qwen3_*.yaml")):
        cfg = load_config(CERConfig, path)
        length = cfg.max_prompt_tokens + cfg.max_response_tokens
        key = (cfg.loss.micro_batch_size, length, cfg.loss.kl_coef, cfg.loss.logprob_chunk)
        shapes.setdefault(key, {"configs": []})["configs"].append(f"cer/{path.stem}")
    return [
        {"batch": b, "length": t, "kl_coef": kl, "chunk": c, **v}
        for (b, t, kl, c), v in shapes.items()
    ]


def run_one(batch: int, length: int, path: str, chunk: int, kl_coef: float) -> dict:
    """``one`` in a fresh process (its peak RSS is this update's alone)."""
    command = [sys.executable, __file__, "--one", str(batch), str(length), path]
    command += ["--chunk", str(chunk), "--kl-coef", str(kl_coef)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if run.returncode:
        raise SystemExit(f"{batch}x{length} {path}: {run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def paper_table() -> list[str]:
    rows = [
        "| configs | B x T | kl_coef | chunk | whole logits fp32 | old path (est. 4x) "
        "| new: peak MiB | new s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shape in paper_shapes():
        b, t = shape["batch"], shape["length"]
        out = run_one(b, t, "new", shape["chunk"], shape["kl_coef"])
        whole = b * t * VOCAB * 4 / 2**30
        rows.append(
            f"| {', '.join(shape['configs'])} | {b} x {t:,} | {shape['kl_coef']} "
            f"| {shape['chunk']} | {whole:,.1f} GiB | ~{4 * whole:,.0f} GiB "
            f"| {out['peak_mib']:,.0f} | {out['seconds']:.1f} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", default="2x256,2x1024,4x512", help="BxT,... (T: prompt 32 + response)"
    )
    parser.add_argument("--chunk", type=int, default=1024, help="loss.logprob_chunk")
    parser.add_argument("--paths", default="old,new")
    parser.add_argument("--kl-coef", type=float, default=0.1)
    parser.add_argument(
        "--paper", action="store_true", help="each paper config's update shape (new path)"
    )
    parser.add_argument("--one", nargs=3, metavar=("B", "T", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        b, t, path = args.one
        print(json.dumps(one(int(b), int(t), path, args.chunk, args.kl_coef)))
        return
    if args.paper:
        rows = paper_table()
        print(f"\nV = {VOCAB:,}, fp32, CPU, one update in a fresh process each\n")
        print("\n".join(rows))
        return
    rows = ["| B | T | logits [B, T, V] fp32 | old: peak MiB | new: peak MiB | old s | new s |"]
    rows.append("|---|---|---|---|---|---|---|")
    for case in args.cases.split(","):
        b, t = (int(x) for x in case.split("x"))
        out = {}
        for path in args.paths.split(","):
            out[path] = run_one(b, t, path, args.chunk, args.kl_coef)
        whole = b * t * VOCAB * 4 / 2**20
        old, new = out.get("old", {}), out.get("new", {})
        cells = [f"{x.get(k, float('nan')):,.0f}" for x in (old, new) for k in ["peak_mib"]]
        times = [f"{x.get('seconds', float('nan')):.2f}" for x in (old, new)]
        rows.append(
            f"| {b} | {t} | {whole:,.0f} MiB | {cells[0]} | {cells[1]} | {' | '.join(times)} |"
        )
        print(rows[-1], flush=True)
    print(f"\nchunk = {args.chunk} positions, V = {VOCAB:,}, kl_coef 0.1, fp32, CPU\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
