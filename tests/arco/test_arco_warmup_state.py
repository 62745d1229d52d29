"""ARCO's warmup state: its fresh adapters and head come from its seed, not the process's; RL
starts only from a finished warmup made with its own settings; a phase's saved result is plain
data, and an older warmup's pickle is never read."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from test_arco_run import overrides

from arco.cli import main
from arco.config import ArcoConfig
from common.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"


def config(world: Path, out: Path, *more: str) -> ArcoConfig:
    return load_config(ArcoConfig, CONFIG, overrides(world, out, "hf") + list(more))


@pytest.mark.slow
def test_two_warmups_of_one_seed_create_the_same_adapters_and_head(
    tiny_world, tmp_path, monkeypatch
):
    """Each warmup stopped after its collection, whose saved state holds the fresh adapters
    and head; the process's random streams differ before each (as two processes' do under
    torch 2.13), the config's seed is the same: the weights are equal bit for bit."""
    from arco import warmup

    def stop(*args, **kwargs):
        raise KeyboardInterrupt("stopped after the collection")

    monkeypatch.setattr(warmup, "project_and_filter", stop)
    made = []
    for process_seed, name in ((1, "a"), (2, "b")):
        cfg = config(
            tiny_world,
            tmp_path / name,
            "warmup.questions=2",
            "warmup.samples=1",
            "env.max_searches=1",
        )
        random.seed(process_seed)
        np.random.seed(process_seed)
        torch.manual_seed(process_seed)
        with pytest.raises(KeyboardInterrupt):
            warmup.run_warmup(cfg)
        phases = warmup.WarmupPhases(Path(cfg.warmup_dir), warmup.warmup_settings(cfg))
        assert phases.done == ["collect"]
        made.append(phases.skip("collect")["trained"])
    a, b = made
    assert any(".policy." in k for k in a) and any(k.startswith("head.") for k in a)
    assert a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key


def train_args(world: Path, out: Path, *more: str) -> list[str]:
    return ["train", "--config", str(CONFIG), *overrides(world, out, "hf"), *more]


def one_line_exit_2(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.fixture
def no_model_loads(monkeypatch):
    import arco.trainer

    def no_load(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(arco.trainer, "build_arco_model", no_load)


def finished_warmup(world: Path, out: Path, *settings: str) -> Path:
    """A warmup folder whose three phases finished under ``settings``: arco.json, the phases'
    results and markers (what ``run_warmup`` leaves, weights aside)."""
    from arco.warmup import WarmupPhases, warmup_settings
    from arco.warmup_state import warmup_rl_settings

    cfg = config(world, out, *settings)
    folder = Path(cfg.warmup_dir)
    folder.mkdir(parents=True)
    (folder / "arco.json").write_text(json.dumps({"lora": {"r": cfg.lora.r}, "k": 3}))
    phases = WarmupPhases(folder, warmup_settings(cfg), warmup_rl_settings(cfg))
    phases.finish("collect", {"trajs": []})
    phases.finish("pi", {"report": {}})
    phases.finish("mu")
    return folder


def test_train_refuses_a_warmup_that_did_not_finish_naming_the_folder(
    tiny_world, tmp_path, capsys, no_model_loads
):
    """A finished warmup rerun under other settings and killed in its collection: the rerun's
    start (``WarmupPhases`` with the new hash) removed every marker, its arco.json is the old
    warmup's. RL refuses it in one line before any model loads."""
    from arco.warmup import WarmupPhases

    warm = finished_warmup(tiny_world, tmp_path)
    capsys.readouterr()
    WarmupPhases(warm, "another-hash")  # the rerun's start, then killed
    assert (warm / "arco.json").exists() and not (warm / "phases" / "mu.done").exists()
    err = one_line_exit_2(capsys, train_args(tiny_world, tmp_path))
    assert f"warmup_dir {warm} holds no finished warmup" in err
    assert str(warm / "phases" / "mu.done") in err and "arco warmup" in err
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_warmup_made_with_other_rl_settings_naming_them(
    tiny_world, tmp_path, capsys, no_model_loads
):
    """The warmup's LoRA and protocol are RL's too; its own keys (warmup.*, its seed)
    are not: a warmup of other questions or another seed trains (the demo's, the seeds'
    comparisons), one of another LoRA rank or protocol is refused, each key named."""
    warm = finished_warmup(tiny_world, tmp_path, "lora.r=8", "warmup.questions=6", "seed=3")
    err = one_line_exit_2(capsys, train_args(tiny_world, tmp_path, "env.protocol=react"))
    assert f"warmup_dir {warm} was made with other settings than this run's" in err
    assert "lora.r: 8 -> 4" in err and 'env.protocol: "search_r1" -> "react"' in err
    assert "warmup.questions" not in err and "seed" not in err

    import arco.trainer
    from arco.warmup_state import check_warmup_finished

    cfg = config(tiny_world, tmp_path, "lora.r=8")  # the warmup's RL settings: it passes
    check_warmup_finished(cfg)
    assert arco.trainer.build_arco_model  # (the tripwire stays in place)


def test_a_rerun_of_a_finished_warmup_records_its_rl_settings(tiny_world, tmp_path, capsys):
    """A warmup finished before the markers held RL settings: a rerun with its settings loads
    nothing (every phase done) and writes them, and RL starts from it."""
    from arco.warmup import run_warmup
    from arco.warmup_state import check_warmup_finished

    warm = finished_warmup(tiny_world, tmp_path)
    marker = warm / "phases" / "mu.done"
    record = json.loads(marker.read_text())
    marker.write_text(json.dumps({k: v for k, v in record.items() if k != "rl_settings"}))
    cfg = config(tiny_world, tmp_path)
    with pytest.raises(ValueError, match="records no RL settings"):
        check_warmup_finished(cfg)
    assert run_warmup(cfg) == warm
    assert "μ phase done at" in capsys.readouterr().out
    assert json.loads(marker.read_text())["rl_settings"] == record["rl_settings"]
    check_warmup_finished(cfg)


class Plant:
    """A pickle whose loading creates ``path`` (a stand-in for any code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_an_older_warmup_s_pickled_phase_is_never_read_and_runs_again(tmp_path, capsys):
    """``phases/collect.pt`` with its marker, as the warmup before plain formats wrote them,
    holding a pickle that would create a file: not read (the file never appears), said, and
    the phase counts as not done; the phase's new result replaces the pickle."""
    import pickle

    from arco.warmup import WarmupPhases

    planted = tmp_path / "planted"
    phases_dir = tmp_path / "phases"
    phases_dir.mkdir()
    (phases_dir / "collect.pt").write_bytes(pickle.dumps({"trajs": Plant(planted)}))
    marker = {"phase": "collect", "settings": "aaaa", "output": str(phases_dir / "collect.pt")}
    (phases_dir / "collect.done").write_text(json.dumps(marker))
    phases = WarmupPhases(tmp_path, "aaaa")
    assert phases.done == [] and not planted.exists()
    out = capsys.readouterr().out
    assert f"{phases_dir / 'collect.pt'}: an older warmup's pickle, not read" in out
    assert not (phases_dir / "collect.done").exists()
    phases.finish("collect", {"trajs": []})
    assert not (phases_dir / "collect.pt").exists()
    assert WarmupPhases(tmp_path, "aaaa").done == ["collect"]


def test_warmup_questions_are_a_disjoint_seeded_draw_and_too_few_are_one_line(tiny_world, tmp_path):
    """``warmup_questions``: ``warmup.questions`` played and ``warmup.select_questions`` for π's
    epoch choice, disjoint, the same for one seed; more than the training set has: a one-line
    ``ValueError`` naming both keys, before any model loads."""
    from arco.warmup import warmup_questions

    cfg = config(tiny_world, tmp_path, "warmup.questions=3", "warmup.select_questions=2")
    played, select, imported = warmup_questions(cfg)
    assert (len(played), len(select), imported) == (3, 2, None)
    assert not {q.id for q in played} & {q.id for q in select}
    again = warmup_questions(cfg)
    assert ([q.id for q in again[0]], [q.id for q in again[1]]) == (
        [q.id for q in played],
        [q.id for q in select],
    )
    n = len(cfg.assets.questions("train", cfg.question_chars()))
    too_many = config(tiny_world, tmp_path, f"warmup.questions={n}", "warmup.select_questions=1")
    with pytest.raises(ValueError) as err:
        warmup_questions(too_many)
    assert str(err.value).startswith(
        f"warmup needs questions + select_questions = {n + 1} training questions; "
    )
    assert str(err.value).endswith(f" has {n}") and "\n" not in str(err.value)


def test_nap_sleeps_a_vllm_engine_once_and_leaves_an_hf_engine_alone(tmp_path):
    """``nap``: a vLLM engine with ``engine.sleep_during_update`` put to sleep unless asleep;
    an HF engine (the training model) and a vLLM engine without sleep mode never."""
    from arco.warmup import nap

    class Engine:
        asleep = False
        sleeps = 0

        def sleep(self):
            self.sleeps += 1
            self.asleep = True

    cases = [("vllm", True, 1), ("vllm", False, 0), ("hf", True, 0)]
    for backend, sleeps, want in cases:
        cfg = load_config(
            ArcoConfig,
            CONFIG,
            [f"engine.backend={backend}", f"engine.sleep_during_update={str(sleeps).lower()}"],
        )
        engine = Engine()
        nap(cfg.engine, engine)
        nap(cfg.engine, engine)  # asleep already: not again
        assert engine.sleeps == want, (backend, sleeps)
