"""MetricsLogger, read_metrics, write_env_json and progress."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

import numpy as np
import pytest
import torch

from common.train import MetricsLogger, progress, read_metrics, write_env_json


def test_metrics_round_trip_as_one_json_line_per_step(tmp_path):
    with MetricsLogger(tmp_path / "run") as logger:
        logger.log(1, {"loss": torch.tensor(0.5), "lr": 1e-6, "name": "a", "ok": True})
        logger.log(2, {"loss": np.float32(0.25), "count": np.int64(3), "norm": float("nan")})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert records[0] == {"step": 1, "loss": 0.5, "lr": 1e-6, "name": "a", "ok": True}
    assert records[1]["count"] == 3 and records[1]["loss"] == 0.25
    assert np.isnan(records[1]["norm"])


def test_logging_appends_to_an_existing_file(tmp_path):
    MetricsLogger(tmp_path).log(1, {"x": 1})
    MetricsLogger(tmp_path).log(2, {"x": 2})
    assert [r["x"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


@pytest.mark.parametrize(
    ("value", "message"),
    [(torch.ones(2), r"'bad': tensor of shape \(2,\)"), ([1, 2], "'bad': list is not a number")],
)
def test_non_scalar_metrics_are_errors_naming_the_key(tmp_path, value, message):
    with pytest.raises(ValueError, match=message):
        MetricsLogger(tmp_path).log(1, {"bad": value})


def test_only_rank_0_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    MetricsLogger(tmp_path).log(1, {"x": 1})
    assert write_env_json(tmp_path) is None
    assert not list(tmp_path.iterdir())


def test_read_metrics_names_the_bad_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n\n{"step": 2, "x"\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:3: not a JSON line"):
        read_metrics(path)
    path.write_text('{"x": 1}\n')
    with pytest.raises(ValueError, match=":1: expected an object with a 'step' key"):
        read_metrics(path)


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None, reason="installed")
def test_missing_tensorboard_is_a_clear_error(tmp_path):
    with pytest.raises(ImportError, match="needs the tensorboard package: pip install tensorboard"):
        MetricsLogger(tmp_path, use_tensorboard=True)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="installed")
def test_missing_wandb_is_a_clear_error(tmp_path):
    with pytest.raises(ImportError, match="wandb_project='proj'.*pip install wandb"):
        MetricsLogger(tmp_path, wandb_project="proj")


def test_env_json_records_versions_hardware_and_command(tmp_path):
    env = json.loads(write_env_json(tmp_path).read_text())
    assert env["packages"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert env["packages"]["deepspeed"] and env["packages"]["peft"]
    assert env["cpu_count"] == os.cpu_count()
    assert env["ram_bytes"] > 2**30
    assert env["gpus"] == [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    assert env["argv"] == sys.argv
    assert env["python"] == sys.version
    commit = env["git"]["commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit)
    assert (env["git"]["dirty"] is None) == (commit is None)


@pytest.mark.parametrize(("rank", "shown"), [("0", True), ("1", False)])
def test_progress_bar_shows_on_rank_0_only(monkeypatch, capsys, rank, shown):
    monkeypatch.setenv("RANK", rank)
    assert list(progress(range(3), desc="rollouts", total=3)) == [0, 1, 2]
    assert ("rollouts: 100%" in capsys.readouterr().err) == shown


def test_progress_bar_does_not_write_every_update_into_a_log(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    assert sum(progress(range(2000), desc="steps", total=2000)) == sum(range(2000))
    written = capsys.readouterr().err
    # the opening and the closing state only (captured stderr is not a terminal)
    assert written.count("steps:") <= 3, written
    assert "2000/2000" in written


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard")
def test_log_section_turns_tensorboard_on(tmp_path):
    """A trainer's ``log.tensorboard=true`` gives event files holding the numeric metrics."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from arco.config import ArcoConfig
    from cer.config import CERConfig
    from common.config import load_config
    from common.search_grpo import GRPOConfig
    from eviback.config import EviBackConfig

    for cls in (GRPOConfig, EviBackConfig, CERConfig, ArcoConfig):
        assert load_config(cls, None, ["log.tensorboard=true"]).log.tensorboard
    cfg = load_config(GRPOConfig, None, ["log.tensorboard=true"])
    with MetricsLogger.from_config(tmp_path, cfg.log, cfg) as logger:
        logger.log(1, {"reward": 0.25, "name": "a"})
        logger.log(2, {"reward": 0.5})
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["reward"]
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 0.25), (2, 0.5)]
    assert [r["reward"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0.25, 0.5]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb")
def test_log_section_turns_offline_wandb_on(tmp_path, monkeypatch):
    from common.config import load_config
    from common.search_grpo import GRPOConfig

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_config(GRPOConfig, None, ["log.wandb_project=tiny"])
    assert cfg.log.wandb_mode == "offline"
    with MetricsLogger.from_config(tmp_path, cfg.log, cfg) as logger:
        logger.log(1, {"reward": 0.25})
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_log_section_is_off_by_default(tmp_path):
    from common.train.logging import LogConfig

    with MetricsLogger.from_config(tmp_path, LogConfig()) as logger:
        logger.log(1, {"x": 1})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
