"""Two ranks (torchrun, gloo) ask for the same requests through ``common.api_budget.on_rank_zero``:
rank 0 sends them once, every rank gets the answers. Then a cap that stops rank 0 stops both
ranks with its message, and an error on rank 0 reaches rank 1.

Launched by tests/test_api_budget.py. Prints "rank R: ok|stopped|failed <what it got>".
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch.distributed as dist

from common.api_budget import ApiBudget, on_rank_zero
from common.launcher import RunStopped
from common.llm_client import LLMClient

PLAYER = "You are a search agent answering a multi-hop question."  # the stand-in's player contract


def turn(i: int) -> list[dict[str, str]]:
    user = (
        f"Question: q{i}?\n\nTrajectory so far:\n(none)\n\nSearches remaining: 3\nYour next action:"
    )
    return [{"role": "system", "content": PLAYER}, {"role": "user", "content": user}]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--cache", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def ask(first: int, cap: int) -> list[str]:
        client = LLMClient(args.url, "standin", cache_dir=args.cache, budget=ApiBudget(cap))
        time.sleep(0.5)  # longer than the heartbeat: rank 1 waits through several
        return [r.text for r in client.chat_many([turn(i) for i in range(first, first + 4)])]

    def fail() -> None:
        raise ValueError("the teacher's data is broken")

    def say(line: str) -> None:
        # one write per line: the two ranks share a pipe, and print writes the newline apart, so
        # on an unbuffered stdout the other rank's line could land before it (seen in one CI run)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    for name, fn in (("all", lambda: ask(0, 0)), ("capped", lambda: ask(10, 2)), ("error", fail)):
        try:
            got = on_rank_zero(fn, heartbeat_s=0.1)
            say(f"rank {rank}: {name} ok {json.dumps(got)}")
        except RunStopped as e:
            say(f"rank {rank}: {name} stopped {e}")
        except Exception as e:  # noqa: BLE001
            say(f"rank {rank}: {name} failed {type(e).__name__}: {e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
