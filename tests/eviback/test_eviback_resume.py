"""`eviback train` resumes from its latest checkpoint: a run killed after logging step 3 but
before its checkpoint committed, restarted, ends where the uninterrupted run ends (HF engine)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.config import ConfigError, load_config
from common.train import read_metrics
from common.train.run_folder import RunFolder
from eviback.cli import DEFAULT_CONFIG
from eviback.config import EviBackConfig
from eviback.trainer import POLICY_RECORD, check_policy_file, record_policy_file


def overrides(world: Path, run_dir: Path, *extra: str) -> list[str]:
    """3 steps of 2 questions x 2 rollouts, a checkpoint after each, dev (2 questions) at 0, 2, 3."""
    return [
        f"assets.model={world / 'model'}",
        f"assets.train={{tiny: {world / 'train.jsonl'}}}",
        f"assets.dev={{tiny: {world / 'dev.jsonl'}}}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"run_dir={run_dir}",
        "steps=3", "save_every=1", "keep_checkpoints=3", "eval_every=2", "eval_questions=2",
        "questions_per_step=2", "n=2", "loss.micro_batch_size=4", "engine.backend=hf",
        "agent.max_turns=2", "agent.max_turn_tokens=12",
        # A random model earns no reward, so its advantages are 0: weight decay moves the weights
        # from step 1, the KL to the reference (the initial model) then gives gradients and the
        # optimizer moments that step 3 needs restored.
        "train.weight_decay=0.1", "loss.kl_coef=0.1", *extra,
    ]  # fmt: skip


def untimed(run_dir: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith("time/")}
        for r in read_metrics(run_dir / "metrics.jsonl")
    ]


def weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_runs_metrics_and_weights(
    tiny_world, tmp_path, capsys
):
    from eviback.trainer import train_eviback

    def run(run_dir: Path, *extra: str) -> dict:
        cfg = load_config(EviBackConfig, DEFAULT_CONFIG, overrides(tiny_world, run_dir, *extra))
        return train_eviback(cfg)

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    out_c = run(straight)
    # what a kill between step 3's log lines and its checkpoint's commit leaves: the rows,
    # samples and dev results of step 3, the latest complete checkpoint at step 2
    shutil.copytree(straight, killed)
    shutil.rmtree(killed / "checkpoints" / "step_3")
    (killed / "checkpoints" / "latest").write_text("step_2\n")
    capsys.readouterr()
    out_b = run(killed)
    printed = capsys.readouterr().out
    assert f"[eviback] resumed from {killed / 'checkpoints' / 'step_2'} at step 3" in printed
    assert "step 0: dev EM" not in printed  # no step-0 evaluation on resume

    rows = untimed(killed)
    # each step logged once: the trim dropped the killed start's step-3 rows, step 3 ran again
    assert [(r["step"], "dev/em" in r) for r in rows] == [
        (0, True), (1, False), (2, False), (2, True), (3, False), (3, True)
    ]  # fmt: skip
    # same questions, rollouts, rewards, loss and dev results: exactly (one process, the HF
    # engine seeded per call, the RNGs restored from the checkpoint)
    assert rows == untimed(straight)
    assert (killed / "batches.jsonl").read_text() == (straight / "batches.jsonl").read_text()
    # the evaluations before the resume point come from the log
    assert [e["step"] for e in out_b["evals"]] == [0, 2, 3]
    assert out_b["evals"] == out_c["evals"]
    final, resumed = weights(straight, 3), weights(killed, 3)
    assert final.keys() == resumed.keys()
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    before = weights(straight, 2)
    assert any(not torch.equal(final[k], before[k]) for k in final)  # step 3 trained
    step3 = next(r for r in rows if r["step"] == 3 and "loss" in r)
    assert step3["kl"] > 0 and step3["loss"] > 0 and step3["grad_norm"] > 0
    history = [json.loads(x) for x in (killed / "env_history.jsonl").open()]
    assert [h["from_step"] for h in history] == [0, 3]


def test_a_resume_refuses_another_policy_file(tmp_path):
    """The LLM teacher's frozen APE policy is recorded at the start; a resume with other bytes
    under teacher.policy_file stops before any model loads, unless allow_config_change."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("strategy_id: a\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()

    def cfg(*extra: str) -> EviBackConfig:
        over = ["teacher.backend=llm", f"teacher.policy_file={policy}", f"run_dir={run_dir}"]
        return load_config(EviBackConfig, DEFAULT_CONFIG, [*over, *extra])

    def check(folder: RunFolder, *extra: str) -> str | None:
        c = cfg(*extra)
        return check_policy_file(run_dir, c.teacher, folder, c.allow_config_change)

    fresh = RunFolder(run_dir, None, 0, None)
    resuming = RunFolder(run_dir, run_dir / "checkpoints" / "step_2", 3, None)
    sha = check(fresh)
    assert sha == hashlib.sha256(b"strategy_id: a\n").hexdigest()
    record_policy_file(run_dir, str(policy), sha)
    assert json.loads((run_dir / POLICY_RECORD).read_text()) == {"file": str(policy), "sha256": sha}
    assert check(resuming) == sha  # unchanged: resumes
    policy.write_text("strategy_id: b\n")
    with pytest.raises(ConfigError, match="is not the policy run_dir .* started with"):
        check(resuming)
    new = hashlib.sha256(b"strategy_id: b\n").hexdigest()
    assert check(resuming, "allow_config_change=true") == new
    assert check(fresh) == new  # a fresh start records the new one
    # no policy file (the hand-written default, or the oracle): nothing recorded
    assert check(resuming, "teacher.policy_file=''") is None
    record_policy_file(run_dir, "", None)
    assert not (run_dir / POLICY_RECORD).exists()
