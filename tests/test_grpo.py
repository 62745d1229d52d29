"""The reference GRPO loop end to end: one process, and two DeepSpeed ranks with vLLM each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.data import load_qa

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "common" / "configs" / "grpo_tiny.yaml"


def small_run(world: Path, run_dir: Path, backend: str) -> list[str]:
    return [
        f"world={world}",
        f"model={world / 'model'}",
        f"run_dir={run_dir}",
        "steps=2",
        "questions_per_step=2",
        "n=4",
        "eval_every=100",
        "eval_questions=4",
        "loss.micro_batch_size=4",
        f"engine.backend={backend}",
        "engine.kv_cache_mib=64",
        # a random model earns no reward, so its advantages are 0: decay makes every step visible
        "train.weight_decay=0.1",
    ]


@pytest.mark.slow
def test_two_deepspeed_ranks_with_vllm_end_with_identical_weights(
    tiny_world, tmp_path, launch_two_ranks
):
    script = ROOT / "tests" / "scripts" / "grpo_two_ranks.py"
    args = [str(script), "--config", str(CONFIG), *small_run(tiny_world, tmp_path / "run", "vllm")]
    run = launch_two_ranks(args, timeout=900)
    output = run.stdout[-15000:] + run.stderr[-15000:]
    assert run.returncode == 0, output
    assert "rank 0: ok" in output and "rank 1: ok" in output, output
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0.0 <= r["reward"] <= 1.0 for r in steps)
    # per-question dev results: both ranks' shards gathered back into the dev file's order,
    # and their mean is the logged dev EM
    dev_ids = [ex.id for ex in load_qa(tiny_world / "dev.jsonl")[:4]]
    for step in (0, 2):
        rows = [
            json.loads(line)
            for line in (tmp_path / "run" / "dev_results" / f"step_{step:05d}.jsonl").open()
        ]
        assert [r["id"] for r in rows] == dev_ids
        logged = next(r for r in rows_at(tmp_path / "run", step) if "dev/em" in r)
        assert sum(r["em"] for r in rows) / 4 == pytest.approx(logged["dev/em"])


def rows_at(run_dir: Path, step: int) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [r for r in rows if r["step"] == step]


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_weights(tiny_world, tmp_path):
    """One process, HF engine: 1 step, then 1 more after a restart == 2 steps straight."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.config import load_config
    from common.search_grpo import GRPOConfig, train_grpo

    def run(run_dir: Path, steps: int) -> dict:
        over = small_run(tiny_world, run_dir, "hf") + [f"steps={steps}", "save_every=1"]
        return train_grpo(load_config(GRPOConfig, CONFIG, over))

    straight = run(tmp_path / "straight", 2)
    run(tmp_path / "resumed", 1)
    resumed = run(tmp_path / "resumed", 2)
    for a, b in zip(straight["model"].parameters(), resumed["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed" / "checkpoints" / "step_2")
    assert all(
        torch.equal(a, b)
        for a, b in zip(again.parameters(), resumed["model"].parameters(), strict=True)
    )
    # the first process evaluated at steps 0 and 1 (its last), the resumed one at step 2
    assert [e["step"] for e in resumed["evals"]] == [0, 1, 2]
