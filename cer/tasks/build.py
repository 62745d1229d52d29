"""The self-contained tiny CER setup: a tiny task's files plus a tokenizer and a tiny Qwen3.

    python -m cer build-tiny --out runs/cer/tiny/task --seed 0 [--task alias|arithmetic]

writes what the task's ``build`` writes (``cer.tasks.alias``, the default, or ``cer.tasks.arithmetic``) and
``model/``: a byte-level BPE trained on the task's train text (problems, worked solutions, every
answer form, plus the shared world's documents for the alias task's ``shared-names`` and
``shared`` builds), the prompt words and the digits (with no merge of a closing brace into the next
character), and a randomly initialised Qwen3 (the tiny world's builders and sizes). Same seed,
same bytes. Vocabulary: 2048 for the shared-world alias builds (a name is one or two tokens the
model sees in training), 512 for ``--worlds fresh`` (its invented names split into shared syllable
pieces instead of one rare token per name); README: the vocabularies measured.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cer.prompt import INSTRUCTION, SYSTEM_PROMPT
from cer.tasks import alias, arithmetic

TASKS: dict[str, Callable[..., Path]] = {"alias": alias.build, "arithmetic": arithmetic.build}
# Per task: the arithmetic task keeps the vocabulary its measurements were made with; the alias
# task's fresh worlds 512 (names as syllable pieces), its shared world 2048 (README).
VOCAB_SIZES = {"alias": 512, "arithmetic": 1024}
SHARED_VOCAB_SIZE = 2048
# Words the prompts and solutions use beyond the task's own text, so that they are whole tokens.
# FORMER_MC_LINE is the multiple-choice line the prompt had before it took the release's (the
# tiny tasks have no multiple-choice row): kept, so that a seed still builds the same tokenizer.
FORMER_MC_LINE = "Answer with the letter of the correct option only."
EXTRA_TEXT = " ".join(
    [SYSTEM_PROMPT, INSTRUCTION, FORMER_MC_LINE, "\\boxed{ } \\frac{ \\dfrac{ \\text{ \\%"]
    + [str(d) for d in range(10)]
)


def tokenizer_texts(task_dir: str | Path) -> list[str]:
    """The texts the tiny tokenizer is trained on: train problems, worked solutions, answer forms
    and the prompt words, plus the world's documents where the task has them (the alias task's
    shared world: ``documents.jsonl``, a public corpus of one sentence per entity). No dev or
    test problem, question or answer form is read; a shared world's documents state the facts
    dev and test ask about, in other sentences, as a pretraining corpus would."""
    task_dir = Path(task_dir)
    texts = [EXTRA_TEXT]
    docs = task_dir / alias.DOCUMENTS_FILE
    if docs.is_file():
        texts += [
            json.loads(line)["text"] for line in docs.read_text(encoding="utf-8").splitlines()
        ]
    for name, keys in (("train.jsonl", ("problem",)), ("warmup.jsonl", ("solution",))):
        for line in (task_dir / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            texts += [row[k] for k in keys]
            texts += row.get("answer_forms", [])
    # A closing brace learns no merge with what follows ("}." would be one token): CER scores the
    # answer's closing "}" as its own token, which the model must then actually write.
    return [t.replace("}", "} ") for t in texts]


def build_tiny(
    out: str | Path,
    seed: int = 0,
    n_train: int | None = None,
    n_dev: int = 200,
    n_test: int = 200,
    vocab_size: int | None = None,
    task: str = "alias",
    isolate_spaces: bool = False,
    worlds: str | None = None,
    name_holdout: str = alias.DEFAULT_NAME_HOLDOUT,
    canonical_share: float | None = None,
) -> Path:
    """Write the tiny ``task`` into ``out`` and its tokenizer (``vocab_size`` ids, default
    ``VOCAB_SIZES[task]``) + model into ``out/model``. With ``isolate_spaces`` a space is a token
    of its own, so that a name or number has the same ids in the context, at the start of the
    solution and inside ``\\boxed{}`` (measured in the README's warmup table: no gain).
    ``worlds`` (alias task only; default ``alias.DEFAULT_WORLDS``): ``shared-names``,
    ``shared`` or ``fresh``, ``name_holdout`` the shared-names hold-out (``cer.tasks.alias``); the
    shared builds' default vocabulary is ``SHARED_VOCAB_SIZE``, ``n_train`` defaults to
    ``alias.DEFAULT_N_TRAIN`` (2000 for arithmetic); ``canonical_share`` (alias task only):
    the share of warmup solutions boxing the canonical form."""
    if task not in TASKS:
        raise ValueError(f"unknown tiny task {task!r}; known: {', '.join(TASKS)}")
    if worlds is not None and task != "alias":
        raise ValueError(f"worlds={worlds!r} is an option of the alias task only")
    if canonical_share is not None and task != "alias":
        raise ValueError(f"canonical_share={canonical_share} is an option of the alias task only")
    # Imported here so that the task files alone do not wait for torch.
    from common.tinyworld.model import build_model, save_model_folder
    from common.tinyworld.tokenizer import build_tokenizer

    if task == "alias":
        worlds = alias.DEFAULT_WORLDS if worlds is None else worlds
        out = alias.build(out, seed, n_train, n_dev, n_test, worlds, name_holdout, canonical_share)
        default_vocab = VOCAB_SIZES[task] if worlds == "fresh" else SHARED_VOCAB_SIZE
    else:
        out = TASKS[task](out, seed, 2000 if n_train is None else n_train, n_dev, n_test)
        default_vocab = VOCAB_SIZES[task]
    vocab_size = default_vocab if vocab_size is None else vocab_size
    tokenizer = build_tokenizer(
        tokenizer_texts(out), vocab_size=vocab_size, isolate_spaces=isolate_spaces
    )
    save_model_folder(build_model(tokenizer, seed), tokenizer, out / "model")
    return out
