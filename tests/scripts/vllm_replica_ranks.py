"""Two ranks, each with its own colocated vLLM engine, call it a different number of times.

Launched by tests/test_vllm_engine.py under the DeepSpeed launcher. In TRL's colocate layout
(``external_launcher``, tensor parallel 1, no data-parallel group) each rank's engine is its own
replica: rank r generates r + 1 times and then both meet at a barrier. Under a data-parallel
group every engine step would be collective and rank 0 would wait forever in its second call's
peer. Each rank prints "rank R: ok".
"""

from __future__ import annotations

import argparse

import torch.distributed as dist

from common.rollout.engine import SamplingConfig
from common.train.distributed import exit_process, init_distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # passed by the launcher
    args = parser.parse_args()
    rank, world, _ = init_distributed()
    from common.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(args.model, kv_cache_bytes=32 * 2**20, max_model_len=256, seed=rank)
    params = SamplingConfig(n=2, temperature=1.0, max_tokens=4)
    for _ in range(rank + 1):
        (out,) = engine.generate([[1, 2, 3]], params)
        assert len(out) == 2 and all(len(c.token_ids) >= 1 for c in out)
    dist.barrier()
    print(f"rank {rank}: ok (of {world})", flush=True)


if __name__ == "__main__":
    main()
    exit_process(0)
