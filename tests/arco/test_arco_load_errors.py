"""What a user can get wrong around an ARCO start is one line on stderr and exit 2, before the run
folder records anything: a damaged warmup folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arco.cli import main
from arco.rubric_model import ArcoFolderError, build_arco_model, save_arco

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "arco" / "configs" / "tiny.yaml"
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def train_args(world: Path, tmp: Path, *more: str) -> list[str]:
    return [
        "train",
        "--config",
        str(CONFIG),
        f"assets.model={world / 'model'}",
        f"assets.train={world / 'train.jsonl'}",
        f"assets.dev={world / 'dev.jsonl'}",
        f"assets.corpus={world / 'corpus.jsonl'}",
        f"warmup_dir={tmp / 'warmup'}",
        f"run_dir={tmp / 'run'}",
        "engine.backend=hf",
        "lora.r=4",
        "lora.lora_alpha=8",
        *more,
    ]


def mark_finished(world: Path, tmp: Path) -> None:
    """The finished warmup's marker (``phases/mu.done``, this config's RL settings)."""
    from arco.config import ArcoConfig
    from arco.warmup import WarmupPhases, warmup_settings
    from arco.warmup_state import warmup_rl_settings
    from common.config import load_config

    cfg = load_config(ArcoConfig, CONFIG, train_args(world, tmp)[3:])
    WarmupPhases(tmp / "warmup", warmup_settings(cfg), warmup_rl_settings(cfg)).finish("mu")


@pytest.fixture()
def warmup(tiny_world, tmp_path) -> Path:
    """A warmup folder as the warmup writes it (fresh adapters and head, K=3; finished)."""
    torch.manual_seed(0)
    folder = save_arco(build_arco_model(tiny_world / "model", LORA, k=3), tmp_path / "warmup")
    mark_finished(tiny_world, tmp_path)
    return folder


def one_line_exit_2(capsys, args: list[str]) -> str:
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_truncated_head_file_names_it_and_says_to_rerun_the_warmup(
    warmup, tiny_world, tmp_path, capsys
):
    head = warmup / "rubric_head" / "head.safetensors"
    head.write_bytes(head.read_bytes()[:5])
    with pytest.raises(ArcoFolderError, match="rerun the warmup"):
        build_arco_model(tiny_world / "model", LORA, k=3, init_from=warmup)
    err = one_line_exit_2(capsys, train_args(tiny_world, tmp_path))
    assert str(head) in err and "unreadable scoring head" in err and "arco warmup" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_deleted_adapter_file_names_it(warmup, tiny_world, tmp_path, capsys):
    weights = warmup / "adapters" / "policy" / "adapter_model.safetensors"
    weights.unlink()
    err = one_line_exit_2(capsys, train_args(tiny_world, tmp_path))
    assert str(weights) in err and "adapter 'policy' is missing" in err
    assert "rerun the warmup" in err


def test_a_damaged_checkpoint_says_which_checkpoint(warmup, tiny_world, tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "step_2"
    ckpt.parent.mkdir(parents=True)
    warmup.rename(ckpt)
    (ckpt / "adapters" / "rubric" / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(ArcoFolderError, match=r"the checkpoint .*step_2 is damaged"):
        build_arco_model(tiny_world / "model", LORA, k=3, init_from=ckpt)


def test_unreadable_settings_name_arco_json(warmup, tiny_world):
    (warmup / "arco.json").write_text('{"lora": ')
    with pytest.raises(ArcoFolderError, match=r"arco\.json: unreadable ARCO settings"):
        build_arco_model(tiny_world / "model", LORA, k=3, init_from=warmup)


@pytest.mark.parametrize("command", ["warmup", "train"])
@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"is the search useful\nis the answer short\n", "2 criteria, rubric.k=3"),
     (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not UTF-8 text"),
     (b"one\ntwo\x00\x01\nthree\n", ":2: not readable text")],
    ids=["short", "binary", "control"],
)  # fmt: skip
def test_a_bad_criteria_file_is_one_line_before_any_model_loads(
    command, content, expected, tiny_world, tmp_path, capsys, monkeypatch
):
    import arco.trainer
    import arco.warmup

    def no_load(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(arco.warmup, "build_arco_model", no_load)
    monkeypatch.setattr(arco.trainer, "build_arco_model", no_load)
    crit = tmp_path / "criteria.txt"
    crit.write_bytes(content)
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "arco.json").write_text("{}")
    args = train_args(tiny_world, tmp_path, "rubric.mode=fixed", f"rubric.criteria_file={crit}")
    err = one_line_exit_2(capsys, [command, *args[1:]])
    assert str(crit) in err and expected in err
    assert not (tmp_path / "run").exists()


def test_a_start_refused_for_its_rubric_k_does_not_trap_the_corrected_one(
    warmup, tiny_world, tmp_path, capsys, monkeypatch
):
    """As a user meets it: K=2 against a K=3 head stops with one line; the
    corrected start (K=3) is not refused for the settings of the one that never trained."""
    import arco.trainer

    err = one_line_exit_2(capsys, train_args(tiny_world, tmp_path, "rubric.k=2"))
    assert "head gives 3 scores" in err
    assert not (tmp_path / "run" / "config.yaml").exists()

    def engine_fails(*args, **kwargs):  # past the settings and model checks: stop here
        raise ValueError("engine stand-in: the corrected start got this far")

    monkeypatch.setattr(arco.trainer, "build_engine", engine_fails)
    assert main(train_args(tiny_world, tmp_path, "rubric.k=3")) == 2  # the models loaded
    assert "the corrected start got this far" in capsys.readouterr().err
