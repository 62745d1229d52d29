"""Two ZeRO-3 ranks generate with ``HFEngine`` on the training model, rank 0 stopping at its first
token and rank 1 running to ``max_tokens``: ``generate`` must keep the ranks in step (every
forward gathers each layer's weights from both ranks).

Launched by tests/test_hf_engine_zero3.py as ``deepspeed --num_gpus 2 hf_zero3_generate.py
--model DIR --out OUT --timeout S``: the model saved in DIR, loaded by ``load_for_training``
(partitioned as it loads) and trained by a ``TrainEngine`` under ZeRO-3. A rank whose
``generate`` has not returned after S seconds exits with code 1 and its threads' stacks (a hang
fails the test). Each rank writes OUT/rank<R>.json: its completion's tokens and finish reason.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from common.rollout.engine import SamplingConfig
from common.rollout.hf_engine import HFEngine
from common.train import TrainConfig, TrainEngine, load_for_training
from common.train.distributed import barrier, exit_process
from common.train.engine import is_partitioned

PROMPT = "The capital of France is"
MAX_TOKENS = 12


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the deepspeed launcher
    args = parser.parse_args()

    config = TrainConfig(zero_stage=3, bf16=False, total_steps=1)
    engine = TrainEngine(load_for_training(args.model, config), config)
    assert engine.world_size == 2 and is_partitioned(engine.model)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompt = tokenizer(PROMPT).input_ids
    with torch.no_grad():  # both ranks: the greedy first token (a forward gathers on both)
        first = int(engine.model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    stop = [first] if engine.rank == 0 else []  # rank 0 stops at once, rank 1 runs on
    params = SamplingConfig(temperature=0.0, max_tokens=MAX_TOKENS, stop_token_ids=stop)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    [[completion]] = HFEngine(engine.model, tokenizer).generate([prompt], params)
    faulthandler.cancel_dump_traceback_later()
    result = {"first": first, "tokens": completion.token_ids, "finish": completion.finish_reason}
    (args.out / f"rank{engine.rank}.json").write_text(json.dumps(result))
    barrier()
    print(f"rank {engine.rank}: ok", flush=True)


if __name__ == "__main__":
    exit_process(main())
