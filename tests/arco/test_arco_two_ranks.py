"""ARCO's co-evolution RL under the DeepSpeed launcher: two CPU ranks (ZeRO-2 over gloo), each
with its own colocated vLLM engine serving the policy and rubric adapters."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_arco_run import overrides

from arco.config import ArcoConfig
from arco.trainer import step_questions
from common.config import load_config
from common.data import load_qa

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
SCRIPT = ROOT / "tests" / "scripts" / "arco_two_ranks.py"


@pytest.mark.slow
def test_two_deepspeed_ranks_with_vllm_lora_end_with_identical_weights(
    tiny_world, tmp_path, launch_two_ranks
):
    from arco.warmup import run_warmup

    # bf16 as on a GPU: the base in bf16, adapters and head fp32, DeepSpeed on its fp32 path
    over = [*overrides(tiny_world, tmp_path), "train.bf16=true"]
    run_warmup(load_config(ArcoConfig, CONFIG, over))  # single-process, in this process
    run = launch_two_ranks([str(SCRIPT), "--config", str(CONFIG), *over], timeout=600)
    output = run.stdout[-15000:] + run.stderr[-15000:]
    assert run.returncode == 0, output
    digests = dict(re.findall(r"rank (\d): ok ([0-9a-f]{16})", output))
    assert set(digests) == {"0", "1"}, output
    assert digests["0"] == digests["1"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in rows if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["phase_dense"] for r in steps] == [0.0, 1.0]
    assert all(0.0 <= r["reward"] <= 1.0 for r in steps)
    assert all(r["grad_norm/rubric"] > 0.0 for r in steps)  # μ clipped apart from π
    assert [r["step"] for r in rows if "dev/em" in r] == [0, 2]
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    assert (ckpt / "adapters" / "policy" / "adapter_model.safetensors").is_file()
    assert (ckpt / "rubric_head" / "head.safetensors").is_file()
    # the batch is global: the two ranks' questions of a step, rank 0's then rank 1's, are what
    # one rank draws (2 questions x 2 rollouts sparse, 4 x 1 dense), and so is the update's size
    cfg = load_config(ArcoConfig, CONFIG, over)
    # μ's forwards took the shared-prefix trunk (the default) on both ranks, in bf16
    assert cfg.rubric.shared_prefix and "shared_prefix" not in " ".join(over)
    train_set = load_qa(cfg.assets.train)
    batches = [json.loads(line) for line in (tmp_path / "run" / "batches.jsonl").open()]
    assert batches == [
        {
            "step": step,
            "ids": [
                train_set[i].id for i in step_questions(step, cfg.rl, len(train_set), cfg.seed)
            ],
            "trajectories": 4,
        }
        for step in (1, 2)
    ]


def test_batch_statistics_span_all_ranks(monkeypatch):
    """Bucket baselines, class weights and per-bucket step-score metrics are over the whole
    batch: rank 1 of two gets its rows of the one-process result (the gather is faked)."""
    import torch

    import arco.trainer as trainer
    from arco.advantages import dense_advantages
    from arco.losses import class_weights
    from arco.rubrics import RubricItem

    other = ([[0.1, 0.2], [0.5]], [["search", "answer"], ["answer"]])  # rank 0's
    mine = ([[0.3, -0.1, 0.4]], [["search", "search", "answer"]])
    monkeypatch.setattr(trainer, "all_ranks", lambda obj: [other, obj])
    got = trainer.global_dense_advantages(*mine, 0.5, True, rank=1)
    assert got == dense_advantages(other[0] + mine[0], other[1] + mine[1], 0.5, True)[2:]
    assert got != dense_advantages(*mine, 0.5, True)

    monkeypatch.setattr(trainer, "all_ranks", lambda obj: [[1.0, 0.0, 0.0], obj])
    got = trainer.global_class_weights(torch.tensor([0.0]), rank=1)
    torch.testing.assert_close(got, class_weights(torch.tensor([1.0, 0.0, 0.0, 0.0]))[3:])

    monkeypatch.setattr(trainer, "all_ranks", lambda obj: [{"search_2": [0.9]}, obj])
    items = [RubricItem(0, 0, [1], scores=[0.2, 0.4])]
    m = trainer.rubric_metrics(items, [["answer"]], torch.tensor([1.0]), True)
    assert m["step_score/search_2/mean"] == pytest.approx(0.9)
    assert m["step_score/terminal/mean"] == pytest.approx(0.3)
