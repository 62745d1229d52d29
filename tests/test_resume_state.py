"""What a resume restores, and what it must not take from the folder as it is: an optimizer
setting allowed to change is applied (not overwritten by the saved state), a data file edited
since the run started is refused unless allowed, and nothing in the folder runs code."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from common.config import load_config
from common.train import TrainConfig, TrainEngine
from common.train.plain_state import PlainStateError, load_plain, save_plain
from common.train.run_folder import RunFolderError, data_files, open_run_folder


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    """Exact fp32 arithmetic on CPU, a GPU machine too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class Pair(nn.Module):
    """Two weights, loss = their sum: each step's gradient is 1 for both."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum()


def one_step(engine: TrainEngine) -> None:
    engine.backward(engine(torch.tensor([1.0, 1.0])))
    assert engine.step()["stepped"]


def test_an_allowed_lr_and_weight_decay_change_is_applied_after_the_optimizer_state_loads(
    tmp_path, capsys
):
    """AdamW by hand, gradient 1 each step (eps 1e-8 is below float32's resolution here):
    step 1 at lr 0.1, decay 0: m̂ = v̂ = 1, update 0.1: w = [0.9, -2.1]. Resumed at lr 0.2,
    decay 0.5: w ← w (1 - 0.2 · 0.5) = [0.81, -1.89]; m = 0.9·0.1 + 0.1 = 0.19, bias 1 - 0.9² =
    0.19: m̂ = 1; v = 0.999·0.001 + 0.001 = 0.001999, bias 1 - 0.999² = 0.001999: v̂ = 1;
    update 0.2: w = [0.61, -2.09]. The saved state's lr and decay (the old code) give
    [0.8, -2.2]."""
    first = TrainEngine(Pair(), TrainConfig(lr=0.1, weight_decay=0.0, scheduler="constant"))
    one_step(first)
    torch.testing.assert_close(first.model.w.detach(), torch.tensor([0.9, -2.1]))
    first.save_state(tmp_path)

    same = TrainEngine(Pair(), TrainConfig(lr=0.1, weight_decay=0.0, scheduler="constant"))
    same.load_state(tmp_path)
    assert same.settings_changed == [] and "[train]" not in capsys.readouterr().out

    resumed = TrainEngine(Pair(), TrainConfig(lr=0.2, weight_decay=0.5, scheduler="constant"))
    resumed.load_state(tmp_path)
    assert resumed.settings_changed == ["group all: lr 0.1 -> 0.2, weight_decay 0.0 -> 0.5"]
    assert "applied after loading its state: group all: lr 0.1 -> 0.2" in capsys.readouterr().out
    group = resumed.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], resumed.lr) == (0.2, 0.5, 0.2)
    one_step(resumed)
    torch.testing.assert_close(
        resumed.model.w.detach(), torch.tensor([0.61, -2.09]), rtol=0, atol=1e-6
    )
    assert resumed.lr == 0.2  # the schedule's base is the new lr: the next step keeps it


def test_a_changed_lr_keeps_the_schedule_s_factor(tmp_path):
    """Linear warmup over 4 steps from lr 0.1: after 1 step the schedule's factor is 1/4 and the
    rate 0.025; resumed at lr 0.4 the rate is 0.4 / 4 = 0.1, then 0.4 · 2/4 = 0.2."""
    config = dict(weight_decay=0.0, scheduler="constant", warmup_steps=4)
    first = TrainEngine(Pair(), TrainConfig(lr=0.1, **config))
    one_step(first)
    assert first.lr == pytest.approx(0.025)
    first.save_state(tmp_path)
    resumed = TrainEngine(Pair(), TrainConfig(lr=0.4, **config))
    resumed.load_state(tmp_path)
    assert resumed.lr == pytest.approx(0.1)
    one_step(resumed)
    assert resumed.lr == pytest.approx(0.2)


# --- nothing in a run folder runs code ---------------------------------------------------------


class Plant:
    """A pickle whose loading creates ``path`` (a stand-in for any code)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_plain_state_round_trips_types_and_refuses_what_is_not_plain(tmp_path):
    @dataclass
    class Row:
        ids: list[int]
        pair: tuple[str, float]

    state = {
        "tuple": (3, (1, 2), None),
        "ints": {0: {"step": torch.tensor(2.0)}, 1: [True, "x"]},
        "float": [float("nan"), float("inf"), -0.0, 1e-300],
        "numpy": np.arange(5, dtype=np.uint32),
        "rows": [Row([1, 2], ("a", 0.5))],
        "bf16": torch.ones(3, dtype=torch.bfloat16),
        "__tuple__": "a key that looks like a tag",
    }
    save_plain(tmp_path / "s", state, [Row])
    back = load_plain(tmp_path / "s", [Row])
    assert back["tuple"] == (3, (1, 2), None) and isinstance(back["tuple"][1], tuple)
    assert torch.equal(back["ints"][0]["step"], torch.tensor(2.0)) and back["ints"][1] == [
        True,
        "x",
    ]
    assert np.isnan(back["float"][0]) and back["float"][1:] == [float("inf"), -0.0, 1e-300]
    assert back["numpy"].dtype == np.uint32 and back["numpy"].tolist() == [0, 1, 2, 3, 4]
    assert back["rows"] == [Row([1, 2], ("a", 0.5))] and back["__tuple__"] == state["__tuple__"]
    assert back["bf16"].dtype == torch.bfloat16
    with pytest.raises(PlainStateError, match="is not one this state may hold"):
        load_plain(tmp_path / "s")  # Row not named: its fields are never handed to it
    with pytest.raises(PlainStateError, match="Plant is not plain state"):
        save_plain(tmp_path / "p", {"x": Plant(tmp_path / "never")})


def legacy_checkpoint(folder: Path, engine: TrainEngine) -> Path:
    """A checkpoint's state/ as the code before plain formats wrote it: train_state.pt and
    rng_rank0.pt, both torch.save pickles."""
    from common.train.checkpoint import rng_state

    names = {id(p): n for n, p in engine.model.named_parameters()}
    backend = engine._backend
    state = {
        "params": {names[id(p)]: p.detach() for p in backend.params},
        "masters": backend.masters,
        "optimizer": backend.optimizer.state_dict(),
        "scheduler": backend.scheduler.state_dict(),
    }
    folder.mkdir(parents=True)
    torch.save(state, folder / "train_state.pt")
    torch.save(rng_state(), folder / "rng_rank0.pt")
    return folder


def test_an_older_checkpoints_pickles_load_with_weights_only(tmp_path):
    """train_state.pt and rng_rank0.pt as older checkpoints hold them (tensors, containers, the
    numpy RNG's array) still resume: read by torch's weights_only loader, the streams and the
    optimizer exactly as saved."""
    from common.train.checkpoint import _load_rng_state

    first = TrainEngine(Pair(), TrainConfig(lr=0.1, scheduler="constant"))
    one_step(first)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    state = legacy_checkpoint(tmp_path / "state", first)
    want = (random.random(), np.random.rand(), torch.rand(1))
    resumed = TrainEngine(Pair(), TrainConfig(lr=0.1, scheduler="constant"))
    resumed.load_state(state)
    from common.train.checkpoint import set_rng_state

    set_rng_state(_load_rng_state(state, 0))
    assert (random.random(), np.random.rand()) == want[:2] and torch.equal(torch.rand(1), want[2])
    one_step(first)
    one_step(resumed)
    assert torch.equal(first.model.w, resumed.model.w)


@pytest.mark.parametrize("file", ["rng_rank0.pt", "train_state.pt"])
def test_a_malicious_pickle_in_a_checkpoint_is_refused_not_run(tmp_path, file):
    """A run folder from someone else: a checkpoint whose pickle would create a file when
    loaded (the control: torch.load(weights_only=False) does) is refused in one line naming it,
    and the file is never created."""
    from test_checkpoint import build_engine

    from common.train import find_latest_checkpoint, load_checkpoint, save_checkpoint

    engine = build_engine()
    save_checkpoint(engine, tmp_path / "run", 1, {"position": 0})
    ckpt = find_latest_checkpoint(tmp_path / "run")
    state = ckpt / "state"
    for stale in state.glob("rng_rank0.*"):
        stale.unlink()
    legacy_checkpoint(tmp_path / "legacy", engine)
    for name in ("train_state.pt", "rng_rank0.pt"):
        (state / name).write_bytes((tmp_path / "legacy" / name).read_bytes())
    for plain in state.glob("train_state.*"):
        if plain.suffix != ".pt":
            plain.unlink()
    planted = tmp_path / "planted"
    torch.save({"python": Plant(planted), "torch": torch.zeros(1)}, state / file)

    control = tmp_path / "control.pt"
    control.write_bytes((state / file).read_bytes())
    torch.load(control, weights_only=False)  # what the old code did: the file appears
    assert planted.exists()
    planted.unlink()

    with pytest.raises(PlainStateError) as caught:
        load_checkpoint(build_engine(), ckpt)
    msg = str(caught.value)
    assert "\n" not in msg and str(state / file) in msg and "refused" in msg
    assert not planted.exists()


def test_deepspeed_shards_are_read_with_weights_only(tmp_path):
    """DeepSpeed's checkpoint engine reads its shards through ``weights_only_loads``: a ZeRO
    shard's records (stage enum, loss scaler, fragment addresses) load, a planted pickle is
    refused and never run."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
        TorchCheckpointEngine,
    )
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from common.train.engine import weights_only_loads

    holder = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine())
    weights_only_loads(holder)
    shard = {
        "optimizer_state_dict": {
            "loss_scaler": LossScaler(1.0),
            "zero_stage": ZeroStageEnum.gradients,
            "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}],
            "single_partition_of_fp32_groups": [torch.arange(4.0)],
        }
    }
    torch.save(shard, tmp_path / "good.pt")
    got = holder.checkpoint_engine.load(str(tmp_path / "good.pt"), map_location="cpu")
    assert got["optimizer_state_dict"]["zero_stage"] is ZeroStageEnum.gradients
    assert torch.equal(
        got["optimizer_state_dict"]["single_partition_of_fp32_groups"][0], torch.arange(4.0)
    )
    planted = tmp_path / "planted"
    torch.save({"optimizer_state_dict": Plant(planted)}, tmp_path / "bad.pt")
    with pytest.raises(PlainStateError, match="refused: not plain DeepSpeed state"):
        holder.checkpoint_engine.load(str(tmp_path / "bad.pt"), map_location="cpu")
    assert not planted.exists()


# --- the data a run draws from -----------------------------------------------------------------


@dataclass
class Assets:
    train: str = field(default="", metadata={"help": "QA file"})
    dev: dict[str, str] = field(default_factory=dict, metadata={"help": "name -> QA file"})
    corpus: str = field(default="", metadata={"help": "corpus"})
    retrieval_url: str = field(default="", metadata={"help": "server"})


@dataclass
class RunCfg:
    run_dir: str = field(default="", metadata={"help": "output folder"})
    steps: int = field(default=2, metadata={"help": "steps"})
    resume: bool = field(default=True, metadata={"help": "resume"})
    allow_config_change: bool = field(default=False, metadata={"help": "allow a change"})
    assets: Assets = field(default_factory=Assets, metadata={"help": "inputs"})


def checkpointed(run: Path, step: int) -> None:
    """A complete checkpoint of ``step`` as ``find_latest_checkpoint`` reads one."""
    ckpt = run / "checkpoints" / f"step_{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "world_size": 1}))
    (ckpt / "COMPLETE").write_text("")


def test_a_data_file_edited_before_a_resume_is_refused_naming_it_unless_allowed(tmp_path, capsys):
    train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
    train.write_bytes(b'{"id": "q1", "question": "a?", "answer": "b"}\n')
    dev.write_bytes(b'{"id": "d1", "question": "c?", "answer": "d"}\n')
    run = tmp_path / "run"
    keys = [
        f"run_dir={run}",
        f"assets.train={train}",
        f"assets.dev={{tiny: {dev}}}",
        "assets.corpus=/nowhere/corpus.jsonl",
    ]

    def start(*more: str):
        folder = open_run_folder(run, load_config(RunCfg, None, keys + list(more)), begin=False)
        folder.begin()
        folder.close()
        return folder

    start()
    sha = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    record = json.loads((run / "data_files.json").read_text())
    assert record == {
        "files": {
            "assets.train": {"path": str(train), "bytes": 46, "sha256": sha(train.read_bytes())},
            "assets.dev.tiny": {"path": str(dev), "bytes": 46, "sha256": sha(dev.read_bytes())},
        },
        "changes": [],
    }
    checkpointed(run, 1)
    start()  # the same data: resumed

    old = sha(train.read_bytes())
    train.write_bytes(b'{"id": "q2", "question": "a?", "answer": "b"}\n')  # in place, same size
    with pytest.raises(RunFolderError) as caught:
        start()
    msg = str(caught.value)
    assert "\n" not in msg
    assert f"assets.train {train} (sha256 {old[:12]} -> {sha(train.read_bytes())[:12]})" in msg
    assert "allow_config_change=true" in msg and "dev" not in msg.split("assets.train")[0]

    capsys.readouterr()
    start("allow_config_change=true")
    assert "going on with a changed data file (assets.train" in capsys.readouterr().out
    record = json.loads((run / "data_files.json").read_text())
    assert record["files"]["assets.train"]["sha256"] == sha(train.read_bytes())
    [change] = record["changes"]
    assert (change["key"], change["from_step"], change["saved"]) == ("assets.train", 2, old)
    start()  # the change is the run's data now: no allowance needed again
    checkpointed(run, 2)
    train.write_bytes(b"{}\n")
    fresh = load_config(RunCfg, None, keys + ["resume=false"])
    folder = open_run_folder(run, fresh, resume=False, begin=False)  # a new run: nothing to check
    folder.begin()
    folder.close()
    assert json.loads((run / "data_files.json").read_text()) == {
        "files": {
            **record["files"],
            "assets.train": {**record["files"]["assets.train"], "bytes": 3, "sha256": sha(b"{}\n")},
        },
        "changes": [],
    }


def test_each_trainer_s_data_files_are_found(tiny_world):
    """GRPO's default files under assets.world, EviBack's name -> file maps, CER's and ARCO's
    files; the corpus is left out where a retrieval server replaces it."""
    from arco.config import ArcoConfig
    from cer.config import CERConfig
    from common.grpo_config import GRPOConfig
    from eviback.config import EviBackConfig

    root = Path(__file__).resolve().parents[1]
    world = Path(tiny_world)
    grpo = load_config(
        GRPOConfig, root / "common/configs/grpo_tiny.yaml", [f"assets.world={world}"]
    )
    assert {k: v["path"] for k, v in data_files(grpo).items()} == {
        "assets.train": str(world / "train.jsonl"),
        "assets.dev": str(world / "dev.jsonl"),
        "assets.corpus": str(world / "corpus.jsonl"),
    }
    eviback = load_config(
        EviBackConfig,
        root / "eviback/configs/tiny.yaml",
        [
            f"assets.train={{tiny: {world / 'train.jsonl'}}}",
            f"assets.dev={{tiny: {world / 'dev.jsonl'}}}",
            f"assets.corpus={world / 'corpus.jsonl'}",
            "assets.retrieval_url=http://127.0.0.1:9/retrieve",
        ],
    )
    assert sorted(data_files(eviback)) == ["assets.dev.tiny", "assets.train.tiny"]
    for cls, config in (
        (CERConfig, "cer/configs/tiny.yaml"),
        (ArcoConfig, "arco/configs/tiny.yaml"),
    ):
        cfg = load_config(
            cls,
            root / config,
            [f"assets.train={world / 'train.jsonl'}", f"assets.dev={world / 'dev.jsonl'}"],
        )
        assert {"assets.train", "assets.dev"} <= set(data_files(cfg)), cls
