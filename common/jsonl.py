"""Append-only JSON-lines logs: the one reader of a log a run appends to as it goes
(``metrics.jsonl``, ``batches.jsonl``, ``config_changes.jsonl``, ``env_history.jsonl``) and the
one rule for a write the process was killed in:

    a torn last line   no newline after it and not JSON (or not UTF-8): dropped, with a warning
                       naming file:line
    any other bad line a line in the middle, or a whole last line (newline after it), that is not
                       a JSON object with the expected key: a ``ValueError`` naming file:line

``trim_jsonl`` rewrites such a log (atomically) keeping the rows a resumed run keeps, each kept
line byte for byte as it was written. No heavy imports: the scripts that read run folders use it.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_jsonl(path: str | Path, key: str | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a jsonl file a run appends to, in order; each must hold ``key``.

    A torn last line (no newline and not JSON: the process was killed while writing it) is
    dropped with a warning; a malformed line anywhere else is an error naming file and line.
    """
    return [record for record, _ in read_jsonl_lines(path, key, stacklevel=3)]


def read_jsonl_lines(
    path: str | Path, key: str | None = None, stacklevel: int = 2
) -> list[tuple[dict[str, Any], str]]:
    """``read_jsonl``'s records, each with its line as written (no newline)."""
    out = []
    lines = Path(path).read_bytes().split(b"\n")
    for number, raw in enumerate(lines, start=1):
        last = number == len(lines)  # no newline after it: the write may have been cut short
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if last:
                _torn(path, number, raw.decode("utf-8", "replace"), stacklevel)
                break
            raise ValueError(f"{path}:{number}: not UTF-8 text: {err}") from None
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if last:
                _torn(path, number, line, stacklevel)
                break
            raise ValueError(f"{path}:{number}: not a JSON line: {err}") from None
        if not isinstance(record, dict) or (key is not None and key not in record):
            raise ValueError(f"{path}:{number}: expected an object with a {key!r} key")
        out.append((record, line))
    return out


def trim_jsonl(
    path: Path,
    rows: list[tuple[dict[str, Any], str]],
    keep: Callable[[dict[str, Any]], bool],
) -> int:
    """Rewrite ``path`` (atomically) with the lines of ``rows`` (``read_jsonl_lines(path)``)
    whose record ``keep`` accepts, each as written, newline-terminated; the file is untouched
    when that is what it already holds (nothing dropped, no torn line). Returns the rows
    dropped."""
    kept = [line for record, line in rows if keep(record)]
    text = "".join(line + "\n" for line in kept).encode("utf-8")
    if text != path.read_bytes():
        write_atomic(path, text)
    return len(rows) - len(kept)


def write_atomic(path: Path, data: bytes | str) -> None:
    """``data`` into a temporary file beside ``path``, flushed, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _torn(path: str | Path, number: int, line: str, stacklevel: int) -> None:
    warnings.warn(
        f"{path}:{number}: dropped a torn last line (a write cut short): {line[:80]!r}",
        stacklevel=stacklevel + 1,
    )
