"""The self-contained tiny CER setup: a tiny task's files plus a tokenizer and a tiny Qwen3.

    python -m cer build-tiny --out runs/cer/tiny/task --seed 0 [--task alias|arithmetic]

writes what the task's ``build`` writes (``cer.aliastask``, the default, or ``cer.tinytask``) and
``model/``: a byte-level BPE trained on the task's train text (problems, worked solutions, every
answer form), the prompt words and the digits (with no merge of a closing brace into the next
character), and a randomly initialised Qwen3 (the tiny world's builders and sizes). Same seed,
same bytes. The alias task's vocabulary is small (512) so that the invented names split into
shared syllable pieces instead of one rare token per name (README: the vocabulary measured).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cer import aliastask, tinytask
from cer.prompt import INSTRUCTION, MC_INSTRUCTION, SYSTEM_PROMPT

TASKS: dict[str, Callable[..., Path]] = {"alias": aliastask.build, "arithmetic": tinytask.build}
# Per task: the arithmetic task keeps the vocabulary its measurements were made with.
VOCAB_SIZES = {"alias": 512, "arithmetic": 1024}
# Words the prompts and solutions use beyond the task's own text, so that they are whole tokens.
EXTRA_TEXT = " ".join(
    [SYSTEM_PROMPT, INSTRUCTION, MC_INSTRUCTION, "\\boxed{ } \\frac{ \\dfrac{ \\text{ \\%"]
    + [str(d) for d in range(10)]
)


def tokenizer_texts(task_dir: str | Path) -> list[str]:
    """The texts the tiny tokenizer is trained on: train problems, worked solutions, answer forms
    and the prompt words (dev and test text stays unseen)."""
    task_dir = Path(task_dir)
    texts = [EXTRA_TEXT]
    for name, keys in (("train.jsonl", ("problem",)), ("warmstart.jsonl", ("solution",))):
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
    n_train: int = 2000,
    n_dev: int = 200,
    n_test: int = 200,
    vocab_size: int | None = None,
    task: str = "alias",
    isolate_spaces: bool = False,
) -> Path:
    """Write the tiny ``task`` into ``out`` and its tokenizer (``vocab_size`` ids, default
    ``VOCAB_SIZES[task]``) + model into ``out/model``. With ``isolate_spaces`` a space is a token
    of its own, so that a name or number has the same ids in the context, at the start of the
    solution and inside ``\\boxed{}`` (measured in the README's warm-start table: no gain)."""
    if task not in TASKS:
        raise ValueError(f"unknown tiny task {task!r}; known: {', '.join(TASKS)}")
    # Imported here so that the task files alone do not wait for torch.
    from common.tinyworld.model import build_model, save_model_folder
    from common.tinyworld.tokenizer import build_tokenizer

    out = TASKS[task](out, seed, n_train, n_dev, n_test)
    vocab_size = VOCAB_SIZES[task] if vocab_size is None else vocab_size
    tokenizer = build_tokenizer(
        tokenizer_texts(out), vocab_size=vocab_size, isolate_spaces=isolate_spaces
    )
    save_model_folder(build_model(tokenizer, seed), tokenizer, out / "model")
    return out
