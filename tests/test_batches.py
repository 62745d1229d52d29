"""Global batch sizes (common/batches.py): rank r of R gets its contiguous slice of the batch one
rank draws, and a batch that does not split over the ranks stops every trainer in one line
before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.batches import (
    BatchLog,
    check_micro_batches,
    per_rank,
    rank_questions,
    rank_slice,
    step_batch,
)
from common.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ORDER = [5, 3, 0, 4, 1, 2]  # a shuffled order of 6 questions


def test_one_rank_batches_walk_the_order_and_wrap_around():
    assert step_batch(1, ORDER, 4) == [5, 3, 0, 4]
    assert step_batch(2, ORDER, 4) == [1, 2, 5, 3]  # positions 4, 5, 0, 1
    assert step_batch(3, ORDER, 4) == [0, 4, 1, 2]  # positions 2..5
    assert step_batch(4, ORDER, 4) == [5, 3, 0, 4]


def test_each_rank_takes_its_contiguous_slice_of_the_one_rank_batch():
    # two ranks, 4 questions a step: 2 each, the same questions in the same order as one rank
    assert [rank_questions(1, r, 2, ORDER, 4) for r in (0, 1)] == [[5, 3], [0, 4]]
    assert [rank_questions(2, r, 2, ORDER, 4) for r in (0, 1)] == [[1, 2], [5, 3]]
    # four ranks: one each
    assert [rank_questions(2, r, 4, ORDER, 4) for r in range(4)] == [[1], [2], [5], [3]]
    assert rank_questions(3, 0, 1, ORDER, 4) == [0, 4, 1, 2]
    assert rank_slice([7, 8, 9], 1, 3) == [8]
    with pytest.raises(ValueError, match="a batch of 3 does not split over 2 ranks"):
        rank_slice([7, 8, 9], 0, 2)


def test_a_batch_that_does_not_split_is_one_line_naming_key_value_and_world():
    assert per_rank(64, 8, "questions_per_step") == 8
    with pytest.raises(ConfigError) as e:
        per_rank(64, 3, "questions_per_step")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("questions_per_step=64 does not split over world size 3")
    assert check_micro_batches(16, 4, "rl.dense_questions", "rl.micro_batch_size", 4) == 4
    with pytest.raises(ConfigError, match=r"^q gives 6 trajectories per rank at world size 2, "):
        check_micro_batches(6, 4, "q", "loss.micro_batch_size", 2)


def test_batch_log_keeps_earlier_steps_of_a_resumed_run(tmp_path):
    log = BatchLog(tmp_path, 1, is_main=True)
    for step in (1, 2, 3):
        log.write(step, [f"q{step}"], 4)
    BatchLog(tmp_path, 3, is_main=True).write(3, ["again"], 8)  # resumed at step 3
    rows = [json.loads(line) for line in (tmp_path / "batches.jsonl").open()]
    assert rows == [
        {"step": 1, "ids": ["q1"], "trajectories": 4},
        {"step": 2, "ids": ["q2"], "trajectories": 4},
        {"step": 3, "ids": ["again"], "trajectories": 8},
    ]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (  # the reference loop: 8 questions over 3 ranks
            ["common.search_grpo", "--config", "common/configs/grpo_tiny.yaml"],
            "search_grpo: error: questions_per_step=8 does not split over world size 3",
        ),
        (
            ["eviback", "train", "--config", "eviback/configs/tiny.yaml"],
            "questions_per_step=8 does not split over world size 3",
        ),
        (
            ["cer", "train", "--config", "cer/configs/tiny.yaml"],
            "prompts_per_step=8 does not split over world size 3",
        ),
    ],
)
def test_every_trainer_refuses_a_batch_the_ranks_cannot_split_before_anything_loads(
    argv, line, monkeypatch, capsys, tmp_path
):
    """Under a launcher of 3 ranks (its RANK / WORLD_SIZE), every tiny config's batch of 8 stops
    the command with exit 2 and one line, before the assets are even checked (none here). ARCO's
    case is in tests/arco/test_arco_data_order.py."""
    import importlib

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.chdir(tmp_path)  # no runs/ here: an asset check would fail with another line
    module, *args = argv
    args = [str(ROOT / a) if a.endswith(".yaml") else a for a in args]
    main = importlib.import_module(module if module.startswith("common") else f"{module}.cli").main
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert line in err and "\n" not in err, err


def test_each_ranks_share_must_be_whole_micro_batches(monkeypatch, capsys, tmp_path):
    """8 questions x 4 rollouts = 32 over 2 ranks is 16 a rank: not one micro-batch of 32."""
    from common.search_grpo import main

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.chdir(tmp_path)
    config = str(ROOT / "common" / "configs" / "grpo_tiny.yaml")
    assert main(["--config", config, "n=4", "loss.micro_batch_size=32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "search_grpo: error: questions_per_step*n gives 16 trajectories per rank at world size "
        "2, not a multiple of loss.micro_batch_size=32"
    )
