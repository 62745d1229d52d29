"""The reference GRPO loop's held-out test split: which file (``held_out_split``) and the
per-question results of the start and the final policy it writes (test_results/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.config import load_config
from common.grpo_config import GRPOConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "common" / "configs" / "grpo_tiny.yaml"


def test_the_test_split_is_the_world_s_or_the_one_beside_the_training_file(tmp_path):
    from common.search_grpo import held_out_split

    world, data = tmp_path / "world", tmp_path / "data"
    world.mkdir()
    data.mkdir()
    cfg = load_config(GRPOConfig, CONFIG, [f"assets.world={world}"])
    assert held_out_split(cfg) is None  # no test.jsonl: no test evaluation
    (world / "test.jsonl").write_text("")
    assert held_out_split(cfg) == world / "test.jsonl"
    cfg = load_config(GRPOConfig, CONFIG, [f"assets.world={world}", f"assets.train={data}/t.jsonl"])
    assert held_out_split(cfg) is None  # a run on other files: the test split beside them
    (data / "test.jsonl").write_text("")
    assert held_out_split(cfg) == data / "test.jsonl"


@pytest.mark.slow
def test_a_run_writes_test_results_of_its_start_and_final_policy(tiny_world, tmp_path):
    """One step on the HF engine: test_results/ at steps 0 and 1 (the last), the first
    eval_questions test questions in order, rows as dev_results'; no test row between."""
    from common.data import load_qa
    from common.search_grpo import train_grpo

    run_dir = tmp_path / "run"
    over = [
        f"assets.world={tiny_world}",
        f"assets.model={tiny_world / 'model'}",
        f"run_dir={run_dir}",
        "steps=2",
        "eval_every=1",
        "questions_per_step=2",
        "n=2",
        "eval_questions=2",
        "loss.micro_batch_size=4",
        "engine.backend=hf",
        "agent.max_turns=2",
    ]
    train_grpo(load_config(GRPOConfig, CONFIG, over))
    test = sorted(p.name for p in (run_dir / "test_results").iterdir())
    assert test == ["step_00000.jsonl", "step_00002.jsonl"]  # not step 1: the ends only
    assert len(list((run_dir / "dev_results").iterdir())) == 3
    want = [q.id for q in load_qa(tiny_world / "test.jsonl")[:2]]
    dev = json.loads((run_dir / "dev_results" / "step_00002.jsonl").read_text().splitlines()[0])
    for name in test:
        rows = [json.loads(x) for x in (run_dir / "test_results" / name).read_text().splitlines()]
        assert [r["id"] for r in rows] == want
        assert all(set(r) == set(dev) for r in rows)
