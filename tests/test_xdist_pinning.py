"""``make test``'s workers: each pytest-xdist worker on its own CPUs (tests/xdist_pinning.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from xdist_pinning import worker_cpus

HERE = Path(__file__).resolve().parent


def test_workers_split_the_cpus_and_never_share_one():
    assert worker_cpus("gw0", 2, [0, 1]) == [0] and worker_cpus("gw1", 2, [0, 1]) == [1]
    shares = [worker_cpus(f"gw{i}", 3, list(range(8))) for i in range(3)]
    assert shares == [[0, 3, 6], [1, 4, 7], [2, 5]]
    assert worker_cpus("gw0", 2, [5]) == [5]  # more workers than CPUs: left as they are
    assert worker_cpus("", 0, [0, 1]) == [0, 1]  # one process: all of them


def every_cpu() -> None:
    os.sched_setaffinity(0, range(os.cpu_count() or 1))


@pytest.mark.slow
@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="one CPU"
)
def test_two_workers_run_on_disjoint_cpus_with_as_many_torch_threads(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        "from xdist_pinning import pin_xdist_worker\npin_xdist_worker()\n"
    )
    (tmp_path / "test_a.py").write_text(
        "import json, os, pathlib, torch\n"
        "def test_where():\n"
        "    out = pathlib.Path(__file__).with_name(os.environ['PYTEST_XDIST_WORKER'] + '.json')\n"
        "    out.write_text(json.dumps([sorted(os.sched_getaffinity(0)), torch.get_num_threads()]))\n"
    )
    (tmp_path / "test_b.py").write_text((tmp_path / "test_a.py").read_text())
    # the environment `make test`'s workers start from: this worker's own may carry what earlier
    # tests' libraries set (it gave torch 2 threads on 1 CPU in one CI run)
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadfile", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        preexec_fn=every_cpu,  # this test may itself run in a pinned worker
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    (a_cpus, a_threads), (b_cpus, b_threads) = (
        json.loads((tmp_path / f"gw{i}.json").read_text()) for i in (0, 1)
    )
    assert a_cpus and b_cpus and not set(a_cpus) & set(b_cpus)
    assert (a_threads, b_threads) == (len(a_cpus), len(b_cpus))
