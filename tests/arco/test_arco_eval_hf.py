"""``arco eval`` of a run trained with ``engine.backend=hf``: HF generate on the checkpoint's
merged policy (it once said "engine.backend=hf generates with a loaded model; none was given")."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoTokenizer

from arco.cli import main
from arco.rubric_model import build_arco_model

ROOT = Path(__file__).resolve().parents[2]
LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def test_arco_eval_of_an_hf_run_evaluates_the_checkpoint_with_hf(tiny_world, tmp_path, capsys):
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_2"
    torch.manual_seed(0)
    build_arco_model(tiny_world / "model", LORA, k=3).write_checkpoint_files(ckpt, True)
    AutoTokenizer.from_pretrained(tiny_world / "model").save_pretrained(ckpt)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 2}))
    (ckpt / "COMPLETE").write_text("")
    (run / "checkpoints" / "latest").write_text("step_2\n")
    dev = tmp_path / "dev4.jsonl"
    dev.write_text("".join((tiny_world / "dev.jsonl").read_text().splitlines(True)[:4]))
    code = main(
        [
            "eval",
            "--config",
            str(ROOT / "arco" / "configs" / "tiny.yaml"),
            "engine.backend=hf",
            f"run_dir={run}",
            f"assets.dev={dev}",
            "assets.eval={}",
            f"assets.corpus={tiny_world / 'corpus.jsonl'}",
        ]
    )
    out = capsys.readouterr()
    assert code == 0, out.err
    results = json.loads((run / "eval" / "results.json").read_text())
    assert results["checkpoint"] == str(ckpt)
    assert results["results"]["dev"]["questions"] == 4
    assert 0.0 <= results["results"]["dev"]["em"] <= 1.0
    assert len((run / "eval" / "per_question" / "dev.jsonl").read_text().splitlines()) == 4
