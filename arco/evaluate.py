"""``arco eval``: greedy EM/F1 of a run's latest checkpoint (its policy, merged into a plain HF
model by the checkpoint) on each benchmark of ``assets.eval`` (default: the dev file).

Writes ``run_dir/eval/results.json``, ``results.md`` and ``per_question/<benchmark>.jsonl`` (one
row per question, ``common.rl_loop.question_rows``), or the same under ``out``; ``checkpoint``
chooses another checkpoint than the latest (``experiments.evaluate_all``). ``engine.backend=hf``
generates with HF on that merged model (a run trained with the HF engine evaluates with it). Under the launcher each rank
evaluates its shard of the questions and the metrics are averaged over ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from arco.config import ArcoConfig
from arco.environment import build_environment
from common.config import path_name
from common.rl_loop import build_engine, evaluate
from common.train import find_latest_checkpoint
from common.train.distributed import init_distributed


def run_eval(
    cfg: ArcoConfig, checkpoint: str | Path | None = None, out: str | Path | None = None
) -> dict:
    from transformers import AutoTokenizer

    cfg.check_assets(("retrieval",) + (("eval",) if cfg.assets.eval else ("dev",)))
    run_dir = Path(cfg.run_dir)
    ckpt = Path(checkpoint) if checkpoint else find_latest_checkpoint(run_dir)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir}: no complete checkpoint; train first (`arco train`)")
    for name in cfg.assets.eval:  # each becomes per_question/<name>.jsonl
        path_name(name, "assets.eval")
    data = cfg.assets.benchmarks(cfg.question_chars())  # kept by assets.eval_where (dev: dev_where)
    rank, world, _ = init_distributed()
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    model = None
    if cfg.engine.backend == "hf":  # HF generate on the checkpoint's merged policy
        from transformers import AutoModelForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype="auto").to(device).eval()
    engine = build_engine(cfg.engine, str(ckpt), model, tokenizer, cfg.seed + rank)
    retriever, agent_cfg = build_environment(
        cfg.env,
        cfg.agent,
        cfg.assets.corpus,
        cfg.assets.retrieval_url,
        cfg.assets.retrieval_max_wait_s,
    )
    out_dir = Path(out) if out else run_dir / "eval"
    results = {}
    for name, examples in data.items():
        rows = out_dir / "per_question" / f"{path_name(name, 'assets.eval')}.jsonl"
        results[name] = {
            "questions": len(examples),
            **evaluate(
                engine,
                tokenizer,
                retriever,
                examples,
                agent_cfg,
                rank,
                world,
                results_path=rows,
                desc=f"arco eval {name}",  # stderr: questions done, a second (rank 0)
            ),
        }
    lines = [
        f"ARCO policy of {ckpt}",
        "",
        "| benchmark | questions | EM | F1 | answered | searches |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in results.items():
        lines.append(
            f"| {name} | {m['questions']} | {m['em']:.3f} | {m['f1']:.3f} | "
            f"{m['valid_answer_rate']:.2f} | {m['mean_searches']:.2f} |"
        )
    table = "\n".join(lines)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(
            json.dumps({"checkpoint": str(ckpt), "results": results}, indent=1)
        )
        (out_dir / "results.md").write_text(table + "\n")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    return {"checkpoint": str(ckpt), "results": results, "table": table, "main": rank == 0}
