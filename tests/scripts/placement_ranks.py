"""Two ranks emulating two nodes for ``common.multinode.check_placement``: each case gives each
rank a host name and a run folder (one shared folder, or one folder a rank: a node that does not
mount the run's folder) and the service URLs; each rank writes what the check said to
``OUT/<case>.rank<r>.txt`` ("ok" or the error).

Launched by tests/test_multinode.py as ``torchrun --nproc_per_node 2 placement_ranks.py --out DIR``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common.config import ConfigError
from common.multinode import check_placement
from common.train.distributed import exit_process, init_distributed

LOOPBACK = {"assets.retrieval_url": "http://127.0.0.1:8000/retrieve"}
ROUTABLE = {"assets.retrieval_url": "http://10.0.0.5:8000/retrieve"}
# case: (host of rank 0, host of rank 1, one shared folder?, urls)
CASES = {
    "one_node_loopback": ("node0", "node0", True, LOOPBACK),
    "two_nodes_routable": ("node0", "node1", True, ROUTABLE),
    "two_nodes_loopback": ("node0", "node1", True, LOOPBACK),
    "unshared_folder": ("node0", "node1", False, ROUTABLE),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    out = Path(parser.parse_args().out)
    rank, _, _ = init_distributed()
    for case, (host0, host1, shared, urls) in CASES.items():
        run_dir = out / case / ("run" if shared else f"run_on_rank{rank}")
        try:
            check_placement(run_dir, urls, host=(host0, host1)[rank])
            said = "ok"
        except ConfigError as e:
            said = str(e)
        (out / f"{case}.rank{rank}.txt").write_text(said)
    return 0


if __name__ == "__main__":
    exit_process(main())
