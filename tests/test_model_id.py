"""A model setting is resolved before any run folder opens: a local folder, the hub cache, or the
hub; offline or unknown, one line that says so. Nothing here reaches the
network: the hub is offline (HF_HUB_OFFLINE=1, an empty HF_HOME) or a stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.model_id import model_problem

ROOT = Path(__file__).resolve().parents[1]
MISSING = "Qwen/NotAModel-0.1B"


@pytest.fixture()
def offline(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "hf_home"
    home.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return home


def cache_model(home: Path, repo: str) -> None:
    """A hub id in the cache as huggingface_hub lays it out (refs/main -> a snapshot)."""
    entry = home / "hub" / f"models--{repo.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("abc123")
    (entry / "snapshots" / "abc123").mkdir(parents=True)
    (entry / "snapshots" / "abc123" / "config.json").write_text("{}")


def test_local_cached_offline_and_typo(offline, tiny_world, tmp_path):
    assert model_problem(str(tiny_world / "model")) is None
    assert "without config.json" in model_problem(str(tmp_path))
    cache_model(offline, "Qwen/Cached-0.1B")
    assert model_problem("Qwen/Cached-0.1B") is None
    line = model_problem(MISSING)
    assert line.startswith(f"assets.model: {MISSING!r} is no local folder and not in the")
    assert "HF_HUB_OFFLINE is set" in line and str(offline) in line and "\n" not in line
    # a one-slash typo of a local path reads as a hub id: it says it is no local folder either
    assert "is no local folder" in model_problem("modles/tiny")
    assert "no such folder" in model_problem(str(tmp_path / "a" / "b"))


def test_online_the_hub_is_asked_once_and_its_answer_is_one_line(tmp_path, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    asked = []

    def not_found(self, repo_id, **kw):
        asked.append(repo_id)
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # no HTTP response here
        Exception.__init__(err, "404 Repository Not Found")
        raise err

    monkeypatch.setattr(HfApi, "model_info", not_found)
    assert "the hub has no model of that name" in model_problem(MISSING)
    assert asked == [MISSING]

    def unreachable(self, repo_id, **kw):
        raise ConnectionError("Max retries exceeded with url: /api/models/Qwen/NotAModel-0.1B")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    line = model_problem(MISSING)
    assert "the hub cannot be reached (ConnectionError" in line and "HF_HUB_OFFLINE=1" in line
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kw: object())
    assert model_problem(MISSING) is None


def test_arco_train_offline_unknown_model_is_one_line_before_the_run_folder(
    offline, tiny_world, tmp_path, capsys
):
    from arco.cli import main

    warm = tmp_path / "warmup"
    warm.mkdir()
    (warm / "arco.json").write_text("{}")
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(ROOT / "arco" / "configs" / "tiny.yaml"),
            f"assets.model={MISSING}",
            f"assets.train={tiny_world / 'train.jsonl'}",
            f"assets.dev={tiny_world / 'dev.jsonl'}",
            f"assets.corpus={tiny_world / 'corpus.jsonl'}",
            f"warmup_dir={warm}",
            f"run_dir={run}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert MISSING in err and "HF_HUB_OFFLINE is set" in err
    assert not run.exists()


def test_eviback_and_cer_resolve_the_same_way(offline, tiny_world, tmp_path, capsys):
    from cer.config import CERConfig, MissingAssetError, check_assets
    from common.config import load_config
    from eviback.cli import main as eviback_main

    run = tmp_path / "run"
    code = eviback_main(
        [
            "train",
            "--config",
            str(ROOT / "eviback" / "configs" / "tiny.yaml"),
            f"assets.model={MISSING}",
            f"assets.train={{tiny: {tiny_world / 'train.jsonl'}}}",
            f"assets.dev={{tiny: {tiny_world / 'dev.jsonl'}}}",
            f"assets.corpus={tiny_world / 'corpus.jsonl'}",
            f"run_dir={run}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert MISSING in err and "HF_HUB_OFFLINE is set" in err
    assert not run.exists()
    cfg = load_config(
        CERConfig, ROOT / "cer" / "configs" / "tiny.yaml", [f"assets.model={MISSING}"]
    )
    with pytest.raises(MissingAssetError, match="HF_HUB_OFFLINE is set"):
        check_assets(cfg.assets, ["model"])
    cache_model(offline, MISSING)
    check_assets(cfg.assets, ["model"])  # cached: found
