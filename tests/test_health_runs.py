"""The health guards end to end: a tiny GRPO run on the tiny world whose engine
misbehaves in one way stops through its command with one line and exit code 3, where it would
otherwise train on nothing. The engines are the real HF engine, changed in that one way."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

import cer.trainer as cer_trainer
import common.rl_loop as rl_loop
from common.launcher import STOPPED_EXIT_CODE, run_command
from common.rollout.hf_engine import HFEngine
from common.train import gpu_memory
from common.train.gpu_memory import GIB

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "common" / "configs" / "grpo_tiny.yaml"


class OneSamplePerPrompt(HFEngine):
    """Samples each distinct prompt of a call once and hands every request of it that sample:
    what GPU vLLM does when a group's requests share one seed."""

    def generate(self, prompts, params, adapter=None):
        unique = list(dict.fromkeys(tuple(p) for p in prompts))
        once = super().generate(
            [list(p) for p in unique], dataclasses.replace(params, n=1), adapter
        )
        first = {p: out[0] for p, out in zip(unique, once, strict=True)}
        return [[copy.deepcopy(first[tuple(p)]) for _ in range(params.n)] for p in prompts]


class OtherWeights(HFEngine):
    """Samples from its own copy of the policy with every weight moved by Gaussian noise (std
    ``noise``): an engine whose weights are not the trained ones (never pushed, or another
    checkpoint), so its sampling log-probs are another model's."""

    noise = 0.05

    def __init__(self, model, tokenizer, **kw):
        other = copy.deepcopy(model)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(torch.randn(p.shape, generator=g) * self.noise)
        super().__init__(other, tokenizer, **kw)


def grpo_command(world: Path, run_dir: Path, engine_class, *more: str) -> tuple[int, list[str]]:
    """``python -m common.search_grpo`` in this process (its ``main`` under ``run_command``) on
    the tiny world with an HF engine of ``engine_class``: the exit code and the metrics rows."""
    from common.search_grpo import main

    def build(cfg, model_path, model, tokenizer, seed):
        return engine_class(model, tokenizer)

    over = [f"assets.world={world}", f"assets.model={world / 'model'}", f"run_dir={run_dir}",
            "steps=4", "questions_per_step=1", "n=4", "eval_every=0", "loss.micro_batch_size=4",
            "agent.max_turns=2", "agent.max_turn_tokens=8", "agent.topk=1", "agent.max_obs_tokens=32",
            "engine.backend=hf", *more]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rl_loop, "build_engine", build)
        with pytest.raises(SystemExit) as exited:
            run_command(lambda: main(["--config", str(CONFIG), *over]))
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.open()] if path.exists() else []
    return exited.value.code, rows


def test_identical_groups_stop_a_run_in_one_line(tiny_world, tmp_path, capsys):
    code, rows = grpo_command(
        tiny_world, tmp_path / "run", OneSamplePerPrompt, "max_identical_groups_in_a_row=2"
    )
    assert code == STOPPED_EXIT_CODE
    assert capsys.readouterr().err.splitlines()[-1] == (
        "stopped: [grpo] step 2: every group's rollouts were token-identical "
        "(identical_group_share 1.0) in 2 steps in a row (max_identical_groups_in_a_row=2): no "
        "group has an advantage to learn from (on a GPU: one sampling seed for a group's "
        "requests?); no checkpoint was saved"
    )
    # step 1 logged (1 in a row), step 2 refused; every advantage was 0: no gap measured
    assert [(r["step"], r["identical_group_share"]) for r in rows] == [(1, 1.0)]
    assert rows[0]["guard/identical_groups_in_a_row"] == 1.0


def test_an_engine_sampling_from_other_weights_stops_a_run(tiny_world, tmp_path, capsys):
    # a random model earns no reward (advantages 0): every row is forwarded all the same, so
    # the gap is measured
    code, rows = grpo_command(
        tiny_world,
        tmp_path / "run",
        OtherWeights,
        "max_logprob_gap_in_a_row=2",
        "loss.skip_zero_advantage=false",
    )
    assert code == STOPPED_EXIT_CODE
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("stopped: [grpo] step 2: logprob_gap ") and line.endswith(
        " over logprob_gap_limit=0.1 in 2 steps in a row (max_logprob_gap_in_a_row=2): the "
        "engine samples from another model than the one trained (weights not pushed, a bf16 "
        "rotary buffer, another checkpoint?); no checkpoint was saved"
    ), line
    assert [r["step"] for r in rows] == [1] and rows[0]["logprob_gap"] > 0.1
    assert rows[0]["guard/logprob_gap_over_limit_in_a_row"] == 1.0


def test_the_real_engine_runs_through_with_the_default_limits(tiny_world, tmp_path):
    """The same tiny run with the plain HF engine: the guards at their defaults never stop it
    (its gap ~1e-6; its groups differ)."""
    code, rows = grpo_command(tiny_world, tmp_path / "run", HFEngine, "steps=2",
                              "loss.skip_zero_advantage=false")  # fmt: skip
    assert code == 0
    steps = [r for r in rows if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["logprob_gap"] < 1e-3 and r["identical_group_share"] < 1.0 for r in steps)


class SleepFreesNothing(HFEngine):
    """The HF engine behind a vLLM engine's sleep interface, whose sleep frees nothing (what a
    CUDA device would then read: ``device`` unchanged). ``push_weights`` wakes it."""

    asleep = False

    def sleep(self) -> None:
        self.asleep = True

    def push_weights(self, named_weights) -> None:
        super().push_weights(named_weights)
        self.asleep = False


def test_cers_sleep_before_its_reward_is_checked(tmp_path, capsys):
    """CER puts vLLM to sleep between generation and reward (``engine.sleep_during_update``):
    that sleep goes through the run's check. The device (40 of 80 GiB in use) is read through
    an injected reader; the engine's sleep frees nothing."""
    from cer.cli import main
    from cer.tasks.build import build_tiny

    task = build_tiny(tmp_path / "task", seed=0, n_train=8, n_dev=2, n_test=2)
    over = [f"assets.model={task / 'model'}", f"assets.train={task / 'train.jsonl'}",
            f"assets.dev={task / 'dev.jsonl'}", f"run_dir={tmp_path / 'run'}", "steps=2",
            "prompts_per_step=1", "group_size=2", "loss.micro_batch_size=2", "eval_every=0",
            "max_response_tokens=8", "engine.backend=vllm", "engine.sleep_during_update=true"]  # fmt: skip

    def build(cfg, model_path, model, tokenizer, seed):
        return SleepFreesNothing(model, tokenizer)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cer_trainer, "build_engine", build)
        mp.setattr(gpu_memory, "device_memory", lambda: (40 * GIB, 80 * GIB))
        with pytest.raises(SystemExit) as exited:
            run_command(
                lambda: main(["train", "--config", str(ROOT / "cer/configs/tiny.yaml"), *over])
            )
    assert exited.value.code == STOPPED_EXIT_CODE
    assert capsys.readouterr().err.splitlines()[-1] == (
        "stopped: [cer] step 1: vLLM's sleep freed 0.00 GiB of the device (40.00 -> 40.00 GiB in "
        "use), less than min_sleep_freed_share=0.5 of the 31.00 GiB its memory plan frees "
        "(engine.gpu_memory_utilization x the GPU, less what it keeps asleep): the update would "
        "run beside vLLM's memory"
    )
