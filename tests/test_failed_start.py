"""A start that fails after its run folder opened (a load-time check: the rubric head's K, a
model that does not load, an engine that does not start) leaves no settings behind: the
corrected start with other settings is not refused. In every trainer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from common.config import ConfigError, load_config
from common.train.run_folder import RunFolderError

ROOT = Path(__file__).resolve().parents[1]


class Injected(ConfigError):
    """The load-time failure the test puts after the run folder opened."""


def fail(*args, **kwargs):
    raise Injected("the head gives 3 scores, rubric.k=2 needs 2")


def arco_start(world: Path, tmp: Path, monkeypatch, *more: str):
    import arco.trainer
    from arco.config import ArcoConfig

    monkeypatch.setattr(arco.trainer, "build_arco_model", fail)
    warm = tmp / "warmup"
    warm.mkdir(exist_ok=True)
    (warm / "arco.json").write_text(json.dumps({"lora": {"r": 4}, "k": 3}))
    over = [
        f"assets.model={world / 'model'}",
        f"assets.train={world / 'train.jsonl'}",
        f"assets.dev={world / 'dev.jsonl'}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"warmup_dir={warm}",
        f"run_dir={tmp / 'run'}",
        "engine.backend=hf",
        *more,
    ]
    cfg = load_config(ArcoConfig, ROOT / "arco" / "configs" / "tiny.yaml", over)
    from arco.warmup import WarmupPhases, warmup_settings
    from arco.warmup_state import warmup_rl_settings

    WarmupPhases(warm, warmup_settings(cfg), warmup_rl_settings(cfg)).finish("mu")  # finished
    arco.trainer.train_arco(cfg)


def eviback_start(world: Path, tmp: Path, monkeypatch, *more: str):
    import eviback.trainer
    from eviback.config import EviBackConfig

    monkeypatch.setattr(eviback.trainer, "build_engine", fail)
    over = [
        f"assets.model={world / 'model'}",
        f"assets.train={{tiny: {world / 'train.jsonl'}}}",
        f"assets.dev={{tiny: {world / 'dev.jsonl'}}}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"run_dir={tmp / 'run'}",
        "steps=2",
        "questions_per_step=2",
        "n=4",
        "eval_questions=2",
        "loss.micro_batch_size=8",
        "engine.backend=hf",
        *more,
    ]
    cfg = load_config(EviBackConfig, ROOT / "eviback" / "configs" / "tiny.yaml", over)
    eviback.trainer.train_eviback(cfg)


def grpo_start(world: Path, tmp: Path, monkeypatch, *more: str):
    import common.rl_loop
    import common.search_grpo as grpo

    monkeypatch.setattr(common.rl_loop, "build_engine", fail)  # train_grpo imports it when it runs
    over = [
        f"assets.world={world}",
        f"assets.model={world / 'model'}",
        f"run_dir={tmp / 'run'}",
        "questions_per_step=2",
        "n=4",
        "loss.micro_batch_size=4",
        "engine.backend=hf",
        *more,
    ]
    cfg = load_config(grpo.GRPOConfig, ROOT / "common" / "configs" / "grpo_tiny.yaml", over)
    grpo.train_grpo(cfg)


def cer_start(world: Path, tmp: Path, monkeypatch, *more: str):
    import cer.trainer
    from cer.config import CERConfig
    from cer.tasks.build import build_tiny

    monkeypatch.setattr(cer.trainer, "build_engine", fail)
    task = tmp / "task"
    if not task.exists():
        build_tiny(task, seed=0, n_train=24, n_dev=4, n_test=4)
    over = [
        f"assets.model={task / 'model'}",
        f"assets.train={task / 'train.jsonl'}",
        f"assets.dev={task / 'dev.jsonl'}",
        f"run_dir={tmp / 'run'}",
        "engine.backend=hf",
        *more,
    ]
    cfg = load_config(CERConfig, ROOT / "cer" / "configs" / "tiny.yaml", over)
    cer.trainer.train_cer(cfg)


@pytest.mark.parametrize(
    ("start", "first", "second"),
    [
        (arco_start, "seed=1", "seed=2"),
        (eviback_start, "seed=1", "seed=2"),
        (grpo_start, "seed=1", "seed=2"),
        (cer_start, "seed=1", "seed=2"),
    ],
    ids=["arco", "eviback", "grpo", "cer"],
)
def test_a_failed_start_leaves_no_settings_that_refuse_the_corrected_one(
    start, first, second, tiny_world, tmp_path, monkeypatch
):
    with pytest.raises(Injected):
        start(tiny_world, tmp_path, monkeypatch, first)
    run = tmp_path / "run"
    assert not (run / "config.yaml").exists()
    assert not (run / "env_history.jsonl").exists()
    # the corrected start gets as far as the first one did: no RunFolderError for the old k
    try:
        start(tiny_world, tmp_path, monkeypatch, second)
    except RunFolderError as err:  # the old code: "rubric.k: 2 -> 3 ... allow_config_change"
        pytest.fail(f"the corrected start was refused: {err}")
    except Injected:
        pass
    assert not (run / "config.yaml").exists()


@dataclass
class RunCfg:
    run_dir: str = field(default="", metadata={"help": "output folder"})
    steps: int = field(default=2, metadata={"help": "steps"})
    allow_config_change: bool = field(default=False, metadata={"help": "allow a change"})


def cfg_for(run_dir: Path, *overrides: str) -> RunCfg:
    return load_config(RunCfg, None, [f"run_dir={run_dir}", *overrides])


def test_a_start_that_begins_records_its_settings_and_a_refusal_still_comes_first(tmp_path):
    from common.train.run_folder import open_run_folder

    folder = open_run_folder(tmp_path, cfg_for(tmp_path), begin=False)
    assert not (tmp_path / "config.yaml").exists()
    folder.begin()
    folder.begin()  # once
    folder.close()
    assert (tmp_path / "config.yaml").exists()
    assert len((tmp_path / "env_history.jsonl").read_text().splitlines()) == 1
    # settings that differ from a run that began are refused at open, before any model loads
    with pytest.raises(RunFolderError, match="  steps: 2 -> 3"):
        open_run_folder(tmp_path, cfg_for(tmp_path, "steps=3"), begin=False)
    # an allowed change is recorded only when the start begins
    changed = cfg_for(tmp_path, "steps=3", "allow_config_change=true")
    folder = open_run_folder(tmp_path, changed, begin=False)
    assert not (tmp_path / "config_changes.jsonl").exists()
    folder.begin()
    folder.close()
    assert json.loads((tmp_path / "config_changes.jsonl").read_text())["config"]["steps"] == 3
