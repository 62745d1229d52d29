"""Tracking across a resume: TensorBoard holds each step once (the resumed start
purges what the earlier one logged from its first step on), and W&B resumes the same run (its
id kept in the run folder, ``resume="allow"``). wandb is not installed here: its run-id logic and
its ``init`` arguments are tested as pure functions; TensorBoard for real."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from common.run_config import LogConfig
from common.train import MetricsLogger, read_metrics
from common.train.logging import WANDB_ID_FILE, wandb_init_kwargs, wandb_run_id
from tests.test_run_frame import Trainer, config

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard"
)


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard shows them (every event file of the folder)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


@needs_tensorboard
def test_a_resumed_logger_replaces_the_steps_it_logs_again(tmp_path):
    with MetricsLogger(tmp_path, use_tensorboard=True, start_step=0) as first:
        for step in range(6):  # steps 4 and 5 after the checkpoint of step 3
            first.log(step, {"x": float(step)})
    with MetricsLogger(tmp_path, use_tensorboard=True, start_step=4) as resumed:
        for step in (4, 5, 6):
            resumed.log(step, {"x": 10.0 * step})
    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    assert scalars(tmp_path, "x") == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 40), (5, 50), (6, 60)]


def test_the_start_step_is_read_from_the_log_when_not_given(tmp_path):
    assert MetricsLogger(tmp_path).start_step == 0  # no log: a fresh run
    with MetricsLogger(tmp_path) as logger:
        for step in (0, 1, 2, 2):
            logger.log(step, {"x": 1})
    assert MetricsLogger(tmp_path).start_step == 3  # after the last step logged
    assert MetricsLogger(tmp_path, start_step=1).start_step == 1


@needs_tensorboard
def test_a_killed_run_resumed_by_the_frame_logs_each_step_once(tmp_path, tokenizer):
    """Steps 1-3 logged, the checkpoint of step 2, step 4 refused: the resumed start runs 3 and 4
    again; TensorBoard shows 1-4 once each, step 3's value the resumed start's."""
    run_dir = tmp_path / "run"
    tracked = LogConfig(tensorboard=True)
    first = Trainer(config(run_dir, log=tracked, eval_every=0), tokenizer, fail_at=4)
    with pytest.raises(RuntimeError, match="guard: step 4 refused"):
        first.fit()
    assert [s for s, _ in scalars(run_dir, "loss")] == [1, 2, 3]
    Trainer(config(run_dir, log=tracked, eval_every=0), tokenizer).fit()
    logged = [(r["step"], r["loss"]) for r in read_metrics(run_dir / "metrics.jsonl")]
    shown = scalars(run_dir, "loss")
    assert [s for s, _ in shown] == [1, 2, 3, 4]
    assert [v for _, v in shown] == pytest.approx([v for _, v in logged], rel=1e-6)


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tiny_world / "model")


def test_the_wandb_run_id_is_kept_by_a_resume_and_new_on_a_fresh_start(tmp_path):
    ids = iter(["aaaa1111", "bbbb2222", "cccc3333"])
    first = wandb_run_id(tmp_path, "proj", start_step=0, new_id=lambda: next(ids))
    assert first == "aaaa1111"
    assert (tmp_path / WANDB_ID_FILE).is_file()
    assert wandb_run_id(tmp_path, "proj", start_step=5, new_id=lambda: next(ids)) == first
    # a fresh start (step 0: resume=false, or no checkpoint yet) is another run
    assert wandb_run_id(tmp_path, "proj", start_step=0, new_id=lambda: next(ids)) == "bbbb2222"
    assert wandb_run_id(tmp_path, "proj", start_step=3, new_id=lambda: next(ids)) == "bbbb2222"
    # another project: the stored run is not there, a run of its own
    assert wandb_run_id(tmp_path, "other", start_step=3, new_id=lambda: next(ids)) == "cccc3333"
    made = wandb_run_id(tmp_path / "new", "proj", start_step=2)  # no stored id: a new one
    assert len(made) == 8 and made.isalnum() and made.islower()


def test_wandb_is_started_on_the_stored_run_with_resume_allow(tmp_path):
    kwargs = wandb_init_kwargs("proj", tmp_path, {"seed": 1}, "offline", "aaaa1111")
    assert kwargs == {
        "project": "proj",
        "dir": str(tmp_path),
        "config": {"seed": 1},
        "mode": "offline",
        "id": "aaaa1111",
        "resume": "allow",
    }
