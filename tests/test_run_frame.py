"""The run frame (``common.run.Run``) on its own: the evaluation/checkpoint schedule, run.json, the
resume point, the step-0 evaluation only on a fresh start, the step guards, a kill and resume
that logs what a straight run logs. A stand-in step and update (one optimizer step of a tiny
model on a batch drawn from the step number) in place of a method's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from common.rollout import Trajectory
from common.run import Run, StepBatch, schedule
from common.run_config import EngineConfig, RunLoopConfig
from common.train import TrainConfig, TrainEngine, read_metrics


@dataclass
class FrameConfig(RunLoopConfig):
    """A run config with nothing of a method's."""


def config(run_dir: Path, **kw) -> FrameConfig:
    kw = {"steps": 4, "eval_every": 2, "save_every": 2, "samples_per_step": 1} | kw
    return FrameConfig(run_dir=str(run_dir), engine=EngineConfig(backend="hf"), **kw)


@pytest.fixture(scope="module")
def tokenizer(tiny_world):
    return transformers.AutoTokenizer.from_pretrained(tiny_world / "model")


def tiny_engine() -> TrainEngine:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            vocab_size=97,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    return TrainEngine(model, TrainConfig(lr=1e-2, total_steps=8))


ROWS = [Trajectory(f"g{i}", i, "q", "question", ["a"], [1, 2]) for i in range(2)]


class Trainer:
    """What a trainer hands the frame (a step, and an update in place of the policy's),
    recording what the frame asked of it."""

    def __init__(self, cfg: FrameConfig, tokenizer, fail_at: int | None = None):
        self.cfg, self.steps, self.evaluated = cfg, [], []
        self.run = Run("grpo", cfg)
        self.train = tiny_engine()
        if fail_at is not None:
            self.run.step_checks.append(lambda step, m: self.fail(step, fail_at))
        self.run.begin(
            self.train, tokenizer, engine=None, evaluate=self.evaluate, update=self.update
        )

    @staticmethod
    def fail(step: int, fail_at: int) -> None:
        if step == fail_at:
            raise RuntimeError(f"guard: step {step} refused")

    def evaluate(self, step: int) -> dict[str, float]:
        self.evaluated.append(step)
        return {"em": self.train.model.lm_head.weight.sum().item(), "f1": 0.5}

    def step(self, step: int) -> StepBatch:
        self.steps.append(step)

        def samples(path: Path) -> None:
            path.write_text(json.dumps({"step": step}))

        return StepBatch(ROWS, torch.ones(2), None, [f"q{step}"], {}, samples)

    def update(self, batch: StepBatch) -> dict[str, float]:
        ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(self.steps[-1]))
        loss = self.train(input_ids=ids, labels=ids).loss
        self.train.backward(loss)
        self.train.step()
        return {"loss": loss.item()}

    def fit(self) -> dict:
        return self.run.fit(self.step)


def untimed(run_dir: Path) -> list[dict]:
    """The run's metrics rows without the seconds the frame measures (``time/*``)."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


@pytest.mark.parametrize(
    ("eval_every", "save_every", "evaluated", "saved"),
    [(2, 3, [2, 4, 6, 7], [3, 6, 7]), (0, 0, [], [7]), (3, 1, [3, 6, 7], [1, 2, 3, 4, 5, 6, 7])],
)
def test_schedule_evaluates_and_saves_every_k_steps_and_at_the_last(
    eval_every, save_every, evaluated, saved
):
    cfg = FrameConfig(steps=7, eval_every=eval_every, save_every=save_every)
    due = [schedule(s, cfg) for s in range(1, 8)]
    assert [s for s, (e, _) in zip(range(1, 8), due, strict=True) if e] == evaluated
    assert [s for s, (_, c) in zip(range(1, 8), due, strict=True) if c] == saved


def test_a_fresh_run_evaluates_first_steps_logs_and_records_its_method(tmp_path, tokenizer):
    run_dir = tmp_path / "run"
    t = Trainer(config(run_dir), tokenizer)
    out = t.fit()
    assert t.steps == [1, 2, 3, 4] and t.evaluated == [0, 2, 4]
    assert [e["step"] for e in out["evals"]] == [0, 2, 4]
    assert out["before"]["step"] == 0 and out["after"]["step"] == 4
    record = json.loads((run_dir / "run.json").read_text())
    assert record["method"] == "grpo"
    assert record["config_class"] == f"{__name__}.FrameConfig"
    assert set(record) == {"method", "config_class", "version", "commit"}
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["step"], "dev/em" in r) for r in rows] == [
        (0, True), (1, False), (2, False), (2, True), (3, False), (4, False), (4, True),
    ]  # fmt: skip
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == [
        "step_2",
        "step_4",
    ]
    assert sorted(p.name for p in (run_dir / "samples").iterdir()) == [
        f"step_{s:05d}.json" for s in (1, 2, 3, 4)
    ]
    batches = [json.loads(line) for line in (run_dir / "batches.jsonl").open()]
    assert [(b["step"], b["ids"]) for b in batches] == [(s, [f"q{s}"]) for s in (1, 2, 3, 4)]
    assert (run_dir / "dev_curve.png").is_file()


def test_a_killed_run_resumes_after_its_checkpoint_and_logs_what_a_straight_run_logs(
    tmp_path, tokenizer
):
    straight = Trainer(config(tmp_path / "straight"), tokenizer).fit()
    run_dir = tmp_path / "killed"
    # a guard refuses step 3 after step 2's checkpoint: the step is neither logged nor saved
    first = Trainer(config(run_dir), tokenizer, fail_at=3)
    with pytest.raises(RuntimeError, match="guard: step 3 refused"):
        first.fit()
    assert max(r["step"] for r in read_metrics(run_dir / "metrics.jsonl")) == 2
    assert first.steps == [1, 2, 3]
    resumed = Trainer(config(run_dir), tokenizer)
    out = resumed.fit()
    # resumed after step_2: no step-0 evaluation, the logged ones re-read
    assert resumed.steps == [3, 4] and resumed.evaluated == [4]
    assert [e["step"] for e in out["evals"]] == [0, 2, 4]
    assert out["evals"] == straight["evals"]
    assert untimed(run_dir) == untimed(tmp_path / "straight")
    for a, b in zip(out["model"].parameters(), straight["model"].parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_false_replaces_the_run_and_its_checkpoints(tmp_path, tokenizer):
    run_dir = tmp_path / "run"
    Trainer(config(run_dir, steps=2), tokenizer).fit()
    again = Trainer(config(run_dir, steps=2, resume=False), tokenizer)
    assert not (run_dir / "checkpoints" / "step_2").exists()  # removed at begin
    again.fit()
    assert again.steps == [1, 2] and again.evaluated == [0, 2]


def test_no_evaluation_without_eval_every(tmp_path, tokenizer):
    t = Trainer(config(tmp_path / "run", eval_every=0), tokenizer)
    out = t.fit()
    assert t.evaluated == [] and out["before"] is None and out["after"] is None
    assert not (tmp_path / "run" / "dev_curve.png").exists()


def test_a_run_whose_checkpoints_cannot_fit_stops_before_it_writes(
    tmp_path, tokenizer, monkeypatch
):
    from common.train import checkpoint

    monkeypatch.setattr(checkpoint, "_free_bytes", lambda root: 1000)  # a nearly full disk
    with pytest.raises(checkpoint.CheckpointSpaceError, match="not enough disk space") as err:
        Trainer(FrameConfig(run_dir=str(tmp_path / "run"), steps=4, save_every=2), tokenizer)
    assert "2 checkpoints of about" in str(err.value)  # keep_checkpoints=1: one kept + one new
    assert not (tmp_path / "run" / "run.json").exists()  # nothing of this start written


@pytest.mark.parametrize("stop_after_update", [False, True])
def test_a_stop_inside_a_step_saves_the_last_finished_step_in_one_process(
    tmp_path, tokenizer, stop_after_update
):
    """A retrieval outage (a ``RunStopped``) in step 3 of a run that saves only at its last
    step: before the step's update, the weights are step 2's and are saved, so a resume starts
    at step 3; after it, they are no step's, and nothing is saved."""
    from common.launcher import RunStopped

    cfg = config(tmp_path / "run", steps=6, save_every=0, eval_every=0)
    trainer = Trainer(cfg, tokenizer)
    plain_step, plain_update = trainer.step, trainer.update

    def step(s: int) -> StepBatch:
        if s == 3 and not stop_after_update:
            raise RunStopped("retrieval server down")
        return plain_step(s)

    def update(batch: StepBatch) -> dict[str, float]:
        stats = plain_update(batch)
        if trainer.steps[-1] == 3:  # the weight push after the update fails, say
            raise RunStopped("retrieval server down")
        return stats

    trainer.run.update = update
    with pytest.raises(RunStopped):
        trainer.run.fit(step)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    if stop_after_update:
        assert ckpts == []
        return
    assert ckpts == ["step_2"]
    again = Trainer(config(tmp_path / "run", steps=6, save_every=0, eval_every=0, resume=True),
                    tokenizer)  # fmt: skip
    again.fit()
    assert again.steps == [3, 4, 5, 6]
