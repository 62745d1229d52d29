"""250 real HotpotQA questions in three splits by question, and the corpus of their paragraphs.

    python -m common.smol.data [--out runs/smol/data]

``hotpotqa_distractor_dev_250.jsonl`` (beside this file; README.md: source and licence) holds 250
questions of HotpotQA's distractor dev set in the original JSON, each with its 10 context
paragraphs (2 supporting, 8 distractors; one question has 4) and its supporting facts. ``splits`` shuffles the
questions' ids with ``random.Random(seed)`` and cuts them into train 150, dev 50 and test 50;
``corpus_rows`` gives every distinct paragraph once in Search-R1's corpus format
(``{"id", "contents": '"Title"\\ntext'}``), for the project's BM25 server (the search-agent
mode); the reading-comprehension mode puts a question's own paragraphs in its prompt. ``write``
writes ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` (rows as in the file: ``common.data.load_qa``
reads them) and ``corpus.jsonl``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("hotpotqa_distractor_dev_250.jsonl")
SIZES = {"train": 150, "dev": 50, "test": 50}
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "runs" / "smol" / "data"


def rows(path: Path = SOURCE) -> list[dict[str, Any]]:
    """The questions as written (original HotpotQA rows), in file order."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def splits(seed: int = 0, path: Path = SOURCE) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "dev", "test"}``: the questions shuffled by id with ``seed`` and cut 150 / 50
    / 50, each split in file order."""
    questions = rows(path)
    if len(questions) != sum(SIZES.values()):
        raise ValueError(f"{path}: {len(questions)} questions, expected {sum(SIZES.values())}")
    ids = sorted(q["_id"] for q in questions)
    random.Random(seed).shuffle(ids)
    out, start = {}, 0
    for name, n in SIZES.items():
        chosen = set(ids[start : start + n])
        out[name] = [q for q in questions if q["_id"] in chosen]
        start += n
    return out


def corpus_rows(path: Path = SOURCE) -> list[dict[str, str]]:
    """Every distinct (title, text) paragraph of the questions' contexts once, in order of first
    appearance, as Search-R1's corpus rows with ids ``p0``, ``p1``, ..."""
    seen: dict[tuple[str, str], None] = {}
    for q in rows(path):
        for title, sentences in q["context"]:
            seen.setdefault((title, "".join(sentences)), None)
    return [
        {"id": f"p{i}", "contents": f'"{title}"\n{text}'} for i, (title, text) in enumerate(seen)
    ]


def write(out: str | Path = DEFAULT_OUT, seed: int = 0) -> dict[str, Path]:
    """Write the three splits and the corpus into ``out``; returns the paths by name."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, questions in splits(seed).items():
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions))
    paths["corpus"] = out / "corpus.jsonl"
    paths["corpus"].write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus_rows())
    )
    return paths


def main(argv: list[str] | None = None) -> int:
    from common.config import module_parser

    parser = module_parser("common.smol.data", __doc__)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the folder to write")
    parser.add_argument("--seed", type=int, default=0, help="the split's shuffle")
    args = parser.parse_args(argv)
    for name, path in write(args.out, args.seed).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
