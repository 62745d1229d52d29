"""Several nodes: one run folder and reachable services on every rank, and the environment the
DeepSpeed launcher hands the other nodes (common/multinode.py)."""

from __future__ import annotations

import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.config import ConfigError
from common.multinode import (
    deepspeed_env,
    is_loopback,
    placement_errors,
    service_urls,
    write_deepspeed_env,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:8000/retrieve", True),
        ("http://127.3.2.1:8000", True),
        ("http://localhost:30000/v1", True),
        ("http://[::1]:8000/retrieve", True),
        ("127.0.0.1:8000", True),
        ("http://10.0.0.5:8000/retrieve", False),
        ("http://node07.cluster:8000/v1", False),
        ("https://api.openai.com/v1", False),
    ],
)
def test_loopback_hosts(url, loopback):
    assert is_loopback(url) is loopback


@dataclass
class _Assets:
    model: str = "m"
    retrieval_url: str = "http://127.0.0.1:8000/retrieve"
    teacher_endpoint: str = ""
    annotator_endpoint: str = "http://h:1/v1"


@dataclass
class _Config:
    assets: _Assets = field(default_factory=_Assets)


def test_service_urls_are_the_set_url_and_endpoint_assets():
    assert service_urls(_Config()) == {
        "assets.retrieval_url": "http://127.0.0.1:8000/retrieve",
        "assets.annotator_endpoint": "http://h:1/v1",
    }
    assert service_urls(object()) == {}


def test_placement_errors_name_the_blind_ranks_and_the_loopback_key():
    urls = {"assets.retrieval_url": "http://127.0.0.1:8000/retrieve"}
    one_node = [("a", True)] * 4
    assert placement_errors(Path("/r"), one_node, urls) == []
    seen = [("a", True), ("a", True), ("b", False), ("b", False), ("c", True), ("c", False)]
    errors = placement_errors(Path("/r"), seen, urls)
    assert len(errors) == 2
    assert "rank(s) 2-3, 5 (on b, c) do not see the file rank 0 (on a)" in errors[0]
    assert errors[1].startswith("assets.retrieval_url=http://127.0.0.1:8000/retrieve is a loopback")
    assert "6 ranks are on 3 nodes (a, b, c)" in errors[1]
    assert placement_errors(Path("/r"), seen[:2] + seen[4:5], {"k": "http://10.1.1.1"}) == []


@pytest.mark.slow
def test_two_ranks_as_two_nodes_stop_on_an_unshared_folder_or_a_loopback_url(
    tmp_path, launch_two_ranks
):
    run = launch_two_ranks(
        [str(SCRIPTS / "placement_ranks.py"), "--out", str(tmp_path)], torchrun=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]

    def said(case: str) -> list[str]:
        return [(tmp_path / f"{case}.rank{r}.txt").read_text() for r in (0, 1)]

    assert said("one_node_loopback") == ["ok", "ok"]
    assert said("two_nodes_routable") == ["ok", "ok"]
    loopback = said("two_nodes_loopback")
    assert loopback[0] == loopback[1] and "is a loopback address" in loopback[0]
    assert "not one folder" not in loopback[0]
    unshared = said("unshared_folder")
    for r in (0, 1):  # (each rank names its own run_dir: the emulation gives each its own)
        assert f"run_on_rank{r} is not one folder on every node" in unshared[r]
        assert "rank(s) 1 (on node1) do not see the file rank 0 (on node0) wrote" in unshared[r]
    # the token is gone from the shared folder once every rank read it
    assert not list((tmp_path / "two_nodes_routable" / "run").glob(".placement-*"))


def test_deepspeed_env_forwards_what_a_rank_needs_and_nothing_else():
    environ = {
        "HF_HOME": "/shared/hf",
        "HF_HUB_OFFLINE": "1",
        "VLLM_USE_V1": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "OPENAI_API_KEY": "sk-abc",
        "ZHIPU_API_KEY": "zk-1",
        "HOME": "/root",
        "PATH": "/usr/bin",
        "MY_FLAG": "x y",
    }
    assert deepspeed_env(environ) == [
        "HF_HOME=/shared/hf",
        "HF_HUB_OFFLINE=1",
        "NCCL_SOCKET_IFNAME=eth0",
        "OPENAI_API_KEY=sk-abc",
        "VLLM_USE_V1=1",
        "ZHIPU_API_KEY=zk-1",
    ]
    assert "MY_FLAG=x y" in deepspeed_env(environ, also=["MY_FLAG"])
    with pytest.raises(ConfigError, match="not set in this shell: NOPE"):
        deepspeed_env(environ, also=["NOPE"])
    with pytest.raises(ConfigError, match=r"^HF_TOKEN: its value holds a quote"):
        deepspeed_env({"HF_TOKEN": 'a"b'})


def test_the_written_file_is_owner_only_and_parses_as_deepspeeds_launcher_reads_it(tmp_path):
    path = write_deepspeed_env(tmp_path / ".deepspeed_env", ["A_API_KEY=k", "HF_HOME=/x y"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # deepspeed/launcher/runner.py: each line split once on "=", key and value stripped
    parsed = dict(line.split("=", maxsplit=1) for line in path.read_text().splitlines(True))
    assert {k.strip(): v.strip() for k, v in parsed.items()} == {
        "A_API_KEY": "k",
        "HF_HOME": "/x y",
    }


def test_the_command_writes_the_file_and_refuses_an_unpassable_value(tmp_path):
    env = {"PATH": "/usr/bin", "HF_HOME": "/hf", "T_API_KEY": "t"}
    out = tmp_path / "env"
    command = [sys.executable, "-m", "common.multinode", "deepspeed-env", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "HF_HOME=/hf\nT_API_KEY=t\n"
    assert "forwards HF_HOME, T_API_KEY to every node" in done.stdout
    bad = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=env | {"VLLM_X": "$HOME"}
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: VLLM_X:"), bad.stderr
