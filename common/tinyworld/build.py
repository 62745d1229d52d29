"""Build the tiny-world folder: knowledge base, corpus, questions, tokenizer and model.

Same seed and sizes, same bytes: every file's sha256 goes into `manifest.json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.tinyworld.model_sizes import DEFAULT_MODEL_SIZES, check_model_sizes
from common.tinyworld.questions import SPLITS, SplitSizes, make_questions
from common.tinyworld.world import (
    WorldSizes,
    documents,
    generate_world,
    load_world,
    permute_names,
)

WORLD_FILE = "world.json"
CORPUS_FILE = "corpus.jsonl"
MODEL_DIR = "model"
MANIFEST_FILE = "manifest.json"


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _log(message: str, start: float) -> None:
    print(f"[tinyworld {time.perf_counter() - start:5.1f}s] {message}", flush=True)


def build_world(
    out: str | Path,
    seed: int = 0,
    sizes: WorldSizes | None = None,
    splits: SplitSizes | None = None,
    vocab_size: int = 2048,
    model_sizes: dict[str, int] | None = None,
    split_digits: bool = False,
    rename_seed: int | None = None,
) -> Path:
    """Write world.json, corpus.jsonl, {train,dev,test}.jsonl, model/ and manifest.json into `out`.

    The folder is assembled beside `out` and renamed into place, so an interrupted build never
    leaves a half world; an earlier build in `out` is replaced, any other existing folder is
    refused. `sizes` and `splits` default to `WorldSizes()` and `SplitSizes()`; `model_sizes`
    overrides `DEFAULT_MODEL_SIZES` (layers, width). `rename_seed`: the world of `seed` with its
    names permuted within each kind (`permute_names`): the same names and structure, every
    named fact new, for a model trained on the world of `seed` (its own tokenizer and model
    are built as usual; such a model uses its own).
    """
    start = time.perf_counter()
    sizes = sizes or WorldSizes()
    splits = splits or SplitSizes()
    # every option is checked before any work: a bad one costs nothing and writes nothing
    sizes.validate()
    splits.validate()
    check_model_sizes({**DEFAULT_MODEL_SIZES, **(model_sizes or {})})
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if rename_seed is not None and rename_seed < 0:
        raise ValueError(f"rename_seed must be >= 0, got {rename_seed}")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not (out / MANIFEST_FILE).is_file():
        raise FileExistsError(f"{out} exists and is not a tiny-world build (no {MANIFEST_FILE})")

    world = generate_world(seed, sizes)
    if rename_seed is not None:
        world = permute_names(world, rename_seed)
    docs = documents(world)
    questions = make_questions(world, seed, splits)
    _log(
        f"world: {len(docs)} documents; questions: "
        + ", ".join(f"{s} {len(questions[s])}" for s in SPLITS),
        start,
    )
    # Imported here so that `show`, and bad sizes, do not wait for torch to import.
    from common.tinyworld.model import build_model, save_model_folder
    from common.tinyworld.tokenizer import build_tokenizer

    texts = [d.contents for d in docs] + [q.question for q in questions["train"]]
    tokenizer = build_tokenizer(texts, vocab_size=vocab_size, split_digits=split_digits)
    model = build_model(tokenizer, seed, **(model_sizes or {}))
    n_params = sum(p.numel() for p in model.parameters())
    _log(f"model: {n_params:,} parameters, {len(tokenizer)} tokens", start)

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        (tmp / WORLD_FILE).write_text(
            json.dumps(world.to_json(), indent=1) + "\n", encoding="utf-8"
        )
        _write_jsonl(tmp / CORPUS_FILE, ({"id": d.id, "contents": d.contents} for d in docs))
        for split in SPLITS:
            _write_jsonl(tmp / f"{split}.jsonl", (q.to_flashrag() for q in questions[split]))
        save_model_folder(model, tokenizer, tmp / MODEL_DIR)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "seed": seed,
            "sizes": dataclasses.asdict(sizes),
            "splits": dataclasses.asdict(splits),
            "vocab_size": vocab_size,
            "model_sizes": {**DEFAULT_MODEL_SIZES, **(model_sizes or {})},
            "split_digits": split_digits,
            "rename_seed": rename_seed,
            "files": {p.relative_to(tmp).as_posix(): _sha256(p) for p in files},
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _log(f"wrote {out}", start)
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def describe(folder: str | Path, examples: int = 3) -> str:
    """Counts of a built world and a few example questions of each split, as text."""
    folder = Path(folder)
    if not (folder / MANIFEST_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not a tiny-world build (no {MANIFEST_FILE})")
    world = load_world(folder / WORLD_FILE)
    lines = [f"tiny world {folder} (seed {world.seed})"]
    for kind in ("people", "cities", "countries", "films", "organisations"):
        lines.append(f"  {kind:14s}{len(getattr(world, kind)):6d}")
    lines.append(f"  {'documents':14s}{len(_read_jsonl(folder / CORPUS_FILE)):6d}")
    for split in SPLITS:
        rows = _read_jsonl(folder / f"{split}.jsonl")
        kinds = Counter(f"{r['metadata']['type']}/{r['metadata']['hops']}" for r in rows)
        lines.append(f"{split}: {len(rows)} questions; type/hops: {dict(sorted(kinds.items()))}")
        for row in rows[:examples]:
            meta = row["metadata"]
            lines.append(f"  {row['id']}  {row['question']}  -> {row['golden_answers']}")
            lines.append(f"      queries {meta['gold_queries']}  docs {meta['supporting_ids']}")
    return "\n".join(lines)
