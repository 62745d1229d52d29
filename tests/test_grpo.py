"""The reference GRPO loop end to end: one process, and two DeepSpeed ranks with vLLM each."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from common.data import load_qa

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "common" / "configs" / "grpo_tiny.yaml"


def small_run(world: Path, run_dir: Path, backend: str) -> list[str]:
    return [
        f"assets.world={world}",
        f"assets.model={world / 'model'}",
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
    # the step's token counts are summed over the ranks: 2 questions x 4 rollouts
    assert all(r["shape/trajectories"] == 8 and r["shape/groups"] == 2 for r in steps)
    assert all(r["tokens/generation"] > r["shape/response_tokens"] > 0 for r in steps)
    # the batch is global: each step's 2 questions are one on each rank, in rank order the
    # ones one rank draws (the seed-0 shuffle, 2 a step), and the update has 2 x 4 rollouts
    train_ids = [ex.id for ex in load_qa(tiny_world / "train.jsonl")]
    order = list(range(len(train_ids)))
    random.Random(0).shuffle(order)
    batches = [json.loads(line) for line in (tmp_path / "run" / "batches.jsonl").open()]
    assert batches == [
        {"step": 1, "ids": [train_ids[order[0]], train_ids[order[1]]], "trajectories": 8},
        {"step": 2, "ids": [train_ids[order[2]], train_ids[order[3]]], "trajectories": 8},
    ]
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
    """One process, HF engine: a run killed after logging step 2 but before its checkpoint, then
    restarted == 2 steps straight, in weights and in metrics.jsonl (each step logged once)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from common.config import load_config
    from common.search_grpo import GRPOConfig, train_grpo
    from common.train import read_metrics
    from common.train.run_folder import RunFolderError

    def run(run_dir: Path, steps: int, *more: str) -> dict:
        over = small_run(tiny_world, run_dir, "hf") + [f"steps={steps}", "save_every=1", *more]
        return train_grpo(load_config(GRPOConfig, CONFIG, over))

    straight = run(tmp_path / "straight", 2)
    killed = tmp_path / "resumed"
    run(killed, 2)
    # the state a kill leaves between step 2's log lines and its checkpoint's commit, mid-line
    shutil.rmtree(killed / "checkpoints" / "step_2")
    (killed / "checkpoints" / "latest").write_text("step_1\n")
    with (killed / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')
    with pytest.warns(UserWarning, match="dropped a torn last line"):
        resumed = run(killed, 2)
    for a, b in zip(straight["model"].parameters(), resumed["model"].parameters(), strict=True):
        assert torch.equal(a, b)
    again = AutoModelForCausalLM.from_pretrained(killed / "checkpoints" / "step_2")
    assert all(
        torch.equal(a, b)
        for a, b in zip(again.parameters(), resumed["model"].parameters(), strict=True)
    )
    # the step-0 evaluation comes from the log, the resumed process evaluated at step 2 (its last)
    assert [e["step"] for e in resumed["evals"]] == [0, 2]

    def untimed(run_dir: Path) -> list[dict]:
        rows = read_metrics(run_dir / "metrics.jsonl")
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]

    rows = untimed(killed)
    kinds = [(r["step"], "dev/em" in r) for r in rows]
    assert kinds == [(0, True), (1, False), (2, False), (2, True)]
    assert rows == untimed(tmp_path / "straight")
    # the finished run started again with other settings stops before any work, naming the key
    starts = (killed / "env_history.jsonl").read_text().count("\n")
    with pytest.raises(RunFolderError, match=r"(?m)^  steps: 2 -> 3$"):
        run(killed, 3)
    assert (killed / "env_history.jsonl").read_text().count("\n") == starts
