"""`cer train` resumes from its latest checkpoint: a run killed after logging step 3 but before
its checkpoint committed, restarted, ends where the uninterrupted run ends (HF engine); and
``resume=false`` replaces the run, checkpoints included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cer.config import CERConfig
from cer.tasks.build import build_tiny
from cer.warmup import run_warmup
from common.config import load_config
from common.train import read_metrics

TINY = "cer/configs/tiny.yaml"


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """The tiny alias task, small, and a brief warmup (``task/../warmup/model``): it boxes
    answers, so the rewards vary within groups."""
    task = build_tiny(tmp_path_factory.mktemp("cer_resume") / "task", seed=0, n_train=30,
                      n_dev=4, n_test=4)  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait on each other across threads
    try:
        run_warmup(config(task, task.parent / "run", "warmup.steps=40", "warmup.batch_size=8"))
    finally:
        torch.set_num_threads(threads)
    return task


def config(task: Path, run_dir: Path, *extra: str) -> CERConfig:
    """3 steps of 2 prompts x 4 samples, a checkpoint after each, dev (2 problems) at 0, 2, 3."""
    return load_config(
        CERConfig,
        TINY,
        [
            f"assets.model={task.parent / 'warmup' / 'model'}",
            f"warmup.out={task.parent / 'warmup'}",
            f"assets.init_model={task / 'model'}",
            f"assets.warmup={task / 'warmup.jsonl'}",
            f"assets.train={task / 'train.jsonl'}",
            f"assets.dev={task / 'dev.jsonl'}",
            f"assets.eval.tiny_test={task / 'test.jsonl'}",
            f"run_dir={run_dir}",
            "steps=3", "save_every=1", "keep_checkpoints=3", "eval_every=2", "eval_questions=2",
            "prompts_per_step=2", "group_size=4", "loss.micro_batch_size=8",
            "max_response_tokens=32",
            *extra,
        ],
    )  # fmt: skip


def untimed(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith("time/")}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_run_and_resume_false_replaces_it(
    task, tmp_path, capsys
):
    from cer.trainer import train_cer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only wait on each other across threads
    try:
        straight, killed = tmp_path / "straight", tmp_path / "killed"
        out_c = train_cer(config(task, straight))
        # what a kill between step 3's log lines and its checkpoint's commit leaves
        shutil.copytree(straight, killed)
        shutil.rmtree(killed / "checkpoints" / "step_3")
        (killed / "checkpoints" / "latest").write_text("step_2\n")
        capsys.readouterr()
        out_b = train_cer(config(task, killed))
        printed = capsys.readouterr().out
        assert f"[cer] resumed from {killed / 'checkpoints' / 'step_2'} at step 3" in printed
        assert "step 0: dev accuracy" not in printed  # no step-0 evaluation on resume

        rows = untimed(killed)
        assert [(r["step"], "dev/accuracy" in r) for r in rows] == [
            (0, True), (1, False), (2, False), (2, True), (3, False), (3, True)
        ]  # fmt: skip
        # same prompts, samples, rewards, loss and dev results, exactly: one process, the HF
        # engine seeded per call with the (seed, step) prompt seeds, the RNGs restored
        assert rows == untimed(straight)
        assert (killed / "batches.jsonl").read_text() == (straight / "batches.jsonl").read_text()
        assert [e["step"] for e in out_b["evals"]] == [0, 2, 3]  # 0 and 2 from the log
        assert out_b["evals"] == out_c["evals"]
        evals = json.loads((killed / "dev_evals.json").read_text())
        assert evals == json.loads((straight / "dev_evals.json").read_text())
        final, resumed = weights(straight, 3), weights(killed, 3)
        assert final.keys() == resumed.keys()
        assert all(torch.equal(final[k], resumed[k]) for k in final)
        before = weights(straight, 2)
        assert any(not torch.equal(final[k], before[k]) for k in final)  # step 3 trained
        step3 = next(r for r in rows if r["step"] == 3 and "loss" in r)
        assert step3["reward"] > 0 and step3["mixed_group_share"] > 0 and step3["grad_norm"] > 0

        # resume=false: step 0 again, the earlier run's log and checkpoints replaced (1 step:
        # a change of settings, recorded)
        capsys.readouterr()
        train_cer(config(task, killed, "resume=false", "steps=1", "eval_every=0",
                         "allow_config_change=true"))  # fmt: skip
        printed = capsys.readouterr().out
        assert "resumed" not in printed and "removed the earlier run's" in printed
        assert [r["step"] for r in read_metrics(killed / "metrics.jsonl")] == [1]
        assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["latest", "step_1"]
        assert not (killed / "dev_results").exists() or not any((killed / "dev_results").iterdir())
    finally:
        torch.set_num_threads(threads)
