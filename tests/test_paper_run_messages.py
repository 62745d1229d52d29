"""What a researcher following README.md's "One paper run" reads when an input is missing: the
paper configs' missing-file messages name `make data`, the teacher command carries vLLM's
reasoning parser for GLM-4.7-Flash, and ARCO's release warmup file has its address."""

from __future__ import annotations

from pathlib import Path

import pytest

from arco.config import RELEASE_WARMUP_URL, ArcoConfig
from common.config import load_config
from eviback.config import EviBackConfig

ROOT = Path(__file__).resolve().parent.parent


def test_eviback_s_missing_data_names_make_data():
    cfg = load_config(EviBackConfig, ROOT / "eviback/configs/qwen3_1.7b.yaml", ["run_dir=/nowhere"])
    cfg.assets.train = {"nq": "/nowhere/nq/train.jsonl"}
    with pytest.raises(FileNotFoundError) as err:
        cfg.check_assets(("train",))
    assert str(err.value).startswith(
        "assets.train.nq: /nowhere/nq/train.jsonl not found. To get it"
    )
    assert "`make data METHOD=eviback SCALE=0.6b|1.7b|4b`" in str(err.value)
    cfg.assets.retrieval_url, cfg.assets.corpus = "", "/nowhere/wiki"
    with pytest.raises(FileNotFoundError, match=r"`make data-index INDEX=data/search_r1`, served"):
        cfg.check_assets(("retrieval",))


def test_eviback_s_teacher_command_carries_the_reasoning_parser():
    """In the check's message, the paper config's comment and `make serve-teacher` alike; and
    glm45 is a parser vLLM 0.32.0 registers."""
    cfg = load_config(EviBackConfig, ROOT / "eviback/configs/qwen3_1.7b.yaml", [])
    cfg.assets.teacher_endpoint = ""
    with pytest.raises(ValueError) as err:
        cfg.check_assets(("teacher",))
    command = "vllm serve zai-org/GLM-4.7-Flash --port 8001 --reasoning-parser glm45"
    assert f"`make serve-teacher`, that is `{command}`" in str(err.value)
    comment = (ROOT / "eviback/configs/qwen3_1.7b.yaml").read_text()
    assert (
        "`vllm serve zai-org/GLM-4.7-Flash --port 8001 --tensor-parallel-size 2 "
        "--reasoning-parser glm45`" in comment
    )
    assert "TEACHER_ARGS ?= --reasoning-parser glm45" in (ROOT / "Makefile").read_text()
    reasoning = pytest.importorskip("vllm.reasoning")
    assert "glm45" in reasoning.ReasoningParserManager.list_registered()


@pytest.mark.parametrize("config", ["qwen3_4b_hotpotqa", "llama3.2_3b_musique"])
def test_arco_s_missing_data_names_make_data(config):
    cfg = load_config(ArcoConfig, ROOT / f"arco/configs/{config}.yaml", [])
    cfg.assets.train = "/nowhere/train.json"
    with pytest.raises(FileNotFoundError) as err:
        cfg.check_assets(("train",))
    assert str(err.value).startswith("missing asset: assets.train: '/nowhere/train.json' not found")
    assert "`make data METHOD=arco SCALE=qwen3-4b|llama3.2-3b DATA=hotpotqa|2wiki|musique`" in str(
        err.value
    )


def test_arco_s_release_warmup_file_is_given_with_its_address():
    cfg = load_config(
        ArcoConfig,
        ROOT / "arco/configs/qwen3_4b_hotpotqa.yaml",
        ["warmup.teacher=file", "warmup.release_file=/nowhere/warmup_train.jsonl"],
    )
    with pytest.raises(FileNotFoundError) as err:
        cfg.check_assets(("teacher",))
    assert str(err.value) == (
        "missing asset: warmup.release_file: '/nowhere/warmup_train.jsonl' not found; the ARCO "
        "release's warmup data (HotpotQA, Qwen3-4B): `curl -L -o /nowhere/warmup_train.jsonl "
        "https://raw.githubusercontent.com/zihangtian/ARCO/5974454e522e8997b92bb9c4e5a656ff23894e72"
        "/data/hotpotqa/output/warmup_train_api-gpt-4o-mini_rubric-gpt-5.4-ca_k3_temp1.0_strict_"
        "20260423_210457.jsonl`, or a file in its format"
    )
    # the same commit as the config's HotpotQA splits
    assert (
        cfg.assets.sources["train"].split("/ARCO/")[1][:40]
        == RELEASE_WARMUP_URL.split("/ARCO/")[1][:40]
    )
