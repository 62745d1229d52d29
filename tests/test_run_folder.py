"""Run folders: trimmed log on resume, torn lines, the lock, settings changes, redaction."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from common.config import dump_config, load_config
from common.redact import redact, redact_secrets
from common.train import MetricsLogger, TrainConfig, TrainEngine, read_metrics, save_checkpoint
from common.train.logging import read_jsonl, write_env_json
from common.train.run_folder import RunFolderError, config_diff, open_run_folder

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Section:
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    url: str = field(default="", metadata={"help": "an endpoint"})


@dataclass
class RunCfg:
    run_dir: str = field(default="", metadata={"help": "output folder"})
    steps: int = field(default=2, metadata={"help": "steps"})
    resume: bool = field(default=True, metadata={"help": "resume"})
    allow_config_change: bool = field(default=False, metadata={"help": "allow a change"})
    train: Section = field(default_factory=Section)


def cfg_for(run_dir: Path, *overrides: str) -> RunCfg:
    return load_config(RunCfg, None, [f"run_dir={run_dir}", *overrides])


def tiny_engine() -> TrainEngine:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            vocab_size=97,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    return TrainEngine(model, TrainConfig(lr=1e-2, total_steps=8))


def one_step(engine: TrainEngine) -> None:
    batch = torch.randint(0, 97, (2, 5))
    engine.backward(engine(input_ids=batch, labels=batch).loss)
    engine.step()


def run(run_dir: Path, steps: int, save_at: set[int], cfg: RunCfg, torn: str = "") -> list[int]:
    """A trainer's loop in miniature: open the folder, resume, log and checkpoint each step;
    returns the steps this start ran. ``torn``: a partial line written after the last step."""
    folder = open_run_folder(run_dir, cfg, cfg.resume)
    engine = tiny_engine()
    start = 1
    if folder.checkpoint is not None:
        from common.train import load_checkpoint

        start = load_checkpoint(engine, folder.checkpoint)["step"] + 1
    assert start == max(folder.start_step, 1)
    ran = []
    with MetricsLogger(run_dir) as logger:
        if start == 1:
            logger.log(0, {"dev/em": 0.0})
        for step in range(start, steps + 1):
            one_step(engine)
            logger.log(step, {"loss": float(step)})
            (run_dir / "samples").mkdir(exist_ok=True)
            (run_dir / "samples" / f"step_{step:05d}.json").write_text("[]")
            if step in save_at:
                save_checkpoint(engine, run_dir, step, {"step": step})
            ran.append(step)
    if torn:
        with (run_dir / "metrics.jsonl").open("a") as f:
            f.write(torn)
    folder.close()
    return ran


def test_resume_after_a_kill_logs_each_step_once(tmp_path):
    """Steps 1-4 logged, checkpoint at 2, killed mid-write of step 5's line: the restart resumes
    after step 2, and metrics.jsonl holds steps 0-4 once each, in order."""
    cfg = cfg_for(tmp_path, "steps=4")
    assert run(tmp_path, 4, {2}, cfg, torn='{"step": 5, "lo') == [1, 2, 3, 4]
    with pytest.warns(UserWarning, match=r"metrics.jsonl:6: dropped a torn last line"):
        assert run(tmp_path, 4, {4}, cfg) == [3, 4]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == [
        f"step_{s:05d}.json" for s in (1, 2, 3, 4)
    ]
    # a finished run started again with the same settings does no step and logs nothing twice
    assert run(tmp_path, 4, set(), cfg) == []
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_a_start_without_checkpoint_replaces_the_earlier_log(tmp_path):
    cfg = cfg_for(tmp_path, "steps=2")
    run(tmp_path, 2, set(), cfg)
    (tmp_path / "dev_results").mkdir()
    (tmp_path / "dev_results" / "step_00000.jsonl").write_text("{}\n")
    run(tmp_path, 2, set(), cfg)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert not (tmp_path / "dev_results" / "step_00000.jsonl").exists()


def test_torn_last_line_is_dropped_and_a_bad_middle_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": 0.')
    with pytest.warns(UserWarning, match=rf"{re.escape(str(path))}:3: dropped a torn last line"):
        assert [r["step"] for r in read_jsonl(path, "step")] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, "x": 0.\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}:2: not a JSON line"):
        read_metrics(path)
    # a bad last line that was written whole (newline after it) is not a torn write
    path.write_text('{"step": 1}\n{"step": 2, "x": 0.\n')
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        read_metrics(path)
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        open_run_folder(tmp_path, None, resume=False)


def killed_run_folder(path: Path, batches_tail: str) -> tuple[str, str]:
    """A folder as a run killed after step 4 leaves it, its checkpoint at step 2: metrics.jsonl
    steps 0-4, batches.jsonl steps 1-4 and then ``batches_tail``. Returns both logs' text."""
    ckpt = path / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"step": 2}')
    (ckpt / "COMPLETE").write_text("")
    metrics = "".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in range(5))
    batches = "".join(
        json.dumps({"step": s, "ids": [f"q{s}", "é"], "trajectories": 4}, ensure_ascii=False) + "\n"
        for s in range(1, 5)
    )
    (path / "metrics.jsonl").write_text(metrics)
    (path / "batches.jsonl").write_text(batches + batches_tail, encoding="utf-8")
    return metrics, batches


def test_a_torn_last_line_of_batches_jsonl_is_dropped_and_the_run_resumes(tmp_path):
    """Killed mid-write of step 5's batches row (cut inside a multi-byte character): the start
    warns naming file:line, trims both logs to the checkpoint's step 2, and the resumed run
    appends step 3 after them."""
    from common.batches import BatchLog

    _, batches = killed_run_folder(tmp_path, '{"step": 5, "ids": ["\u00e9')
    path = tmp_path / "batches.jsonl"
    path.write_bytes(path.read_bytes()[:-1])  # half of "é": not even UTF-8
    with pytest.warns(UserWarning, match=rf"{re.escape(str(path))}:5: dropped a torn last line"):
        folder = open_run_folder(tmp_path, None, resume=True)
    assert folder.start_step == 3
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert path.read_text(encoding="utf-8") == "".join(batches.splitlines(True)[:2])  # as written
    BatchLog(tmp_path, 3, is_main=True).write(3, ["q3"], 4)
    assert [r["step"] for r in read_jsonl(path, "step")] == [1, 2, 3]
    folder.close()


@pytest.mark.parametrize("begin", [True, False])
def test_a_bad_middle_line_of_batches_jsonl_stops_the_start_before_any_log_changes(tmp_path, begin):
    """A bad row that is not the last (a later row was written whole after it) is an error
    naming file:line, raised before metrics.jsonl (trimmed first in the old order) or
    batches.jsonl is rewritten and before the start records anything."""
    from common.batches import BatchLog

    metrics, batches = killed_run_folder(tmp_path, '{"step": 5, "ids": [\n{"step": 6}\n')
    path = tmp_path / "batches.jsonl"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:5: not a JSON line"):
        open_run_folder(tmp_path, None, resume=True, begin=begin)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:5: not a JSON line"):
        BatchLog(tmp_path, 3, is_main=True)
    assert (tmp_path / "metrics.jsonl").read_text() == metrics
    assert path.read_text(encoding="utf-8") == batches + '{"step": 5, "ids": [\n{"step": 6}\n'
    assert not (tmp_path / "env_history.jsonl").exists()


HOLDER = """
import sys, time
from common.train.run_folder import open_run_folder
open_run_folder(sys.argv[1], None, resume=False)
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_second_run_on_a_folder_fails_naming_the_holder_until_it_dies(
    tmp_path, monkeypatch, tiny_world
):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        expected = f"in use by pid {holder.pid} on host {socket.gethostname()} since 20"
        with pytest.raises(RunFolderError, match=re.escape(expected)) as err:
            open_run_folder(tmp_path, None, resume=False)
        assert "\n" not in str(err.value)
        # a trainer's entry point stops there too, before any model loads (a warmup here)
        from common.warmup import WarmupConfig, run_warmup

        with pytest.raises(RunFolderError, match=re.escape(expected)):
            run_warmup(WarmupConfig(world=str(tiny_world), out=str(tmp_path)))
        monkeypatch.setenv("RANK", "1")  # a non-zero rank of the holder's own run takes no lock
        assert open_run_folder(tmp_path, None, resume=False).lock is None
        monkeypatch.delenv("RANK")
    finally:
        holder.send_signal(signal.SIGKILL)  # a kill, not an exit: the kernel drops the lock
        holder.wait(timeout=30)
    folder = open_run_folder(tmp_path, None, resume=False)
    holder_info = json.loads((tmp_path / "run.lock").read_text())
    assert holder_info["pid"] == os.getpid()
    folder.close()
    # released: a new descriptor (as another process would open) takes it again
    open_run_folder(tmp_path, None, resume=False).close()


def test_other_settings_are_refused_with_one_line_per_key(tmp_path):
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    saved = (tmp_path / "config.yaml").read_text()
    with pytest.raises(RunFolderError) as err:
        open_run_folder(tmp_path, cfg_for(tmp_path, "steps=3", "train.lr=0.01"))
    lines = str(err.value).splitlines()
    assert lines[1:3] == ["  steps: 2 -> 3", "  train.lr: 0.001 -> 0.01"]
    assert "allow_config_change=true" in lines[-1]
    assert (tmp_path / "config.yaml").read_text() == saved
    assert not (tmp_path / "config_changes.jsonl").exists()
    # the refused start took the lock and gave it back
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()


def test_an_allowed_change_is_recorded_and_config_yaml_keeps_what_ran_first(tmp_path):
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    saved = (tmp_path / "config.yaml").read_text()
    changed = cfg_for(tmp_path, "steps=3", "allow_config_change=true")
    open_run_folder(tmp_path, changed).close()
    assert (tmp_path / "config.yaml").read_text() == saved
    [row] = read_jsonl(tmp_path / "config_changes.jsonl")
    assert row["from_step"] == 0
    assert row["changes"] == [{"key": "steps", "saved": 2, "new": 3}]
    assert row["config"]["steps"] == 3
    # the accepted settings are now the folder's: the same again passes, the first ones do not
    open_run_folder(tmp_path, cfg_for(tmp_path, "steps=3")).close()
    with pytest.raises(RunFolderError, match="  steps: 3 -> 2"):
        open_run_folder(tmp_path, cfg_for(tmp_path))


def test_a_setting_a_newer_version_added_does_not_refuse_the_resume(tmp_path, capsys):
    """A folder written before a key existed (e.g. a new guard's limit) resumes under the key's
    value; the addition is recorded, and a change of an existing key is still refused."""
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    lr = saved["train"].pop("lr")  # as a folder of a version before train.lr existed
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    assert "settings this version added" in capsys.readouterr().out
    [row] = read_jsonl(tmp_path / "config_changes.jsonl")
    assert row["changes"] == [{"key": "train.lr", "saved": "<absent>", "new": lr}]
    with pytest.raises(RunFolderError, match="  steps: 2 -> 3"):
        open_run_folder(tmp_path, cfg_for(tmp_path, "steps=3"))


def test_config_diff_ignores_where_and_how_to_start():
    a = {"run_dir": "a", "resume": True, "allow_config_change": False, "x": {"y": [1, 2]}}
    b = {"run_dir": "b", "resume": False, "allow_config_change": True, "x": {"y": (1, 2)}}
    assert config_diff(a, b) == []
    assert config_diff({"x": 1}, {"x": 1.0}) == []
    assert config_diff({"x": float("nan")}, {"x": float("nan")}) == []
    assert [k for k, *_ in config_diff({"x": True}, {"x": 1, "z": 2})] == ["x", "z"]


def test_env_json_keeps_the_first_start_and_the_history_every_start(tmp_path):
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    first = (tmp_path / "env.json").read_text()
    open_run_folder(tmp_path, cfg_for(tmp_path)).close()
    assert (tmp_path / "env.json").read_text() == first
    history = read_jsonl(tmp_path / "env_history.jsonl")
    assert len(history) == 2 and all(h["from_step"] == 0 for h in history)
    assert history[0]["git"] == json.loads(first)["git"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("http://user:KEY123@host:8000/v1", "http://user:***@host:8000/v1"),
        ("https://:s3cr3t@example.org", "https://:***@example.org"),
        ("http://host:8000/retrieve", "http://host:8000/retrieve"),
        ("http://h/x?api_key=abc&model=m", "http://h/x?api_key=***&model=m"),
        ("http://h/x?model=m&token=abc#f", "http://h/x?model=m&token=***#f"),
        ("https://ghp_0123456789abcdefXYZ@github.com/o/r", "https://***@github.com/o/r"),
        ("git@github.com:o/r.git", "git@github.com:o/r.git"),
        ("train.lr=1e-3", "train.lr=1e-3"),
        (
            "teacher.url=http://u:K@10.0.0.1/v1 x=http://a:B@c",
            "teacher.url=http://u:***@10.0.0.1/v1 x=http://a:***@c",
        ),
    ],
)
def test_redact_masks_only_the_secret(text, expected):
    assert redact(text) == expected


def test_no_credential_reaches_the_run_folder(tmp_path, monkeypatch):
    url = "http://user:KEY123@127.0.0.1:9/v1?api_key=KEY456"
    monkeypatch.setattr(sys, "argv", ["prog", f"train.url={url}"])
    cfg = cfg_for(tmp_path, f"train.url={url}")
    open_run_folder(tmp_path, cfg).close()
    dump_config(cfg, tmp_path / "dumped.yaml")
    write_env_json(tmp_path / "env2")
    for name in ("config.yaml", "dumped.yaml", "env.json", "env_history.jsonl", "env2/env.json"):
        text = (tmp_path / name).read_text()
        assert "KEY123" not in text and "KEY456" not in text, name
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["url"] == (
        "http://user:***@127.0.0.1:9/v1?api_key=***"
    )
    assert redact_secrets({"a": [url], "b": (1, url)})["b"][1].startswith("http://user:***@")
    # the masked value is what a resume compares against: the same key again is no change
    open_run_folder(tmp_path, cfg).close()
    assert not (tmp_path / "config_changes.jsonl").exists()


def test_lock_survives_an_in_process_rerun_after_an_error(tmp_path):
    """An exception inside a run leaves the lock to its process: a rerun in it may go on."""
    folder = open_run_folder(tmp_path, cfg_for(tmp_path))
    again = open_run_folder(tmp_path, cfg_for(tmp_path))
    assert again.lock is folder.lock
    again.close()
    third = open_run_folder(tmp_path, cfg_for(tmp_path))
    assert third.lock is not None and third.lock is not folder.lock
    third.close()
