"""Append-only JSON-lines logs: the one reader of a log a run appends to as it goes
(``metrics.jsonl``, ``batches.jsonl``, ``config_changes.jsonl``, ``env_history.jsonl``) and the
one rule for a write the process was killed in:

    a torn last line   no newline after it and not JSON (or not UTF-8): dropped, with a warning
                       naming file:line
    any other bad line a line in the middle, or a whole last line (newline after it), that is not
                       a JSON object with the expected key: a ``ValueError`` naming file:line

``trim_jsonl`` rewrites such a log (atomically) keeping the rows a resumed run keeps, each kept
line byte for byte as it was written. ``replace_atomic`` is the project's one atomic file write
(a temporary file beside the target, synced, renamed over it): ``write_atomic`` (bytes or text)
and ``write_jsonl_atomic`` (rows as JSON lines) are its two forms. No heavy imports: the scripts
that read run folders use it.

``utf8_text`` is how every text file a user gives is decoded (QA files, corpora, these logs): a
UTF-8 byte order mark at the start is dropped (Windows editors write one), and a byte that is
not UTF-8 is a ``NotUTF8`` naming its line and its byte within the line.
"""

from __future__ import annotations

import codecs
import json
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


class NotUTF8(ValueError):
    """Bytes that are not UTF-8 text: ``line`` and ``byte`` (1-based, the byte within its line)
    of the first bad byte, ``value``; the message says where and, for a file that starts with
    UTF-16's byte order mark, what it is."""

    def __init__(self, line: int, byte: int, value: int, utf16: bool = False):
        self.line, self.byte, self.value = line, byte, value
        hint = "; the file is UTF-16 (its byte order mark): save it as UTF-8" if utf16 else ""
        super().__init__(f"line {line}, byte {byte} of the line is 0x{value:02x}{hint}")


def utf8_text(data: bytes, first_line: int = 1) -> str:
    """``data`` (a file's bytes, or its line ``first_line``) as UTF-8 text, a UTF-8 byte order
    mark at its start dropped; a ``NotUTF8`` naming the line and the byte within it else."""
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return str(memoryview(data)[skip:], "utf-8")  # no copy of a large file
    except UnicodeDecodeError as err:
        start = err.start + skip
        line = first_line + data.count(b"\n", 0, start)
        byte = start - data.rfind(b"\n", 0, start)
        utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
        raise NotUTF8(line, byte, data[start], utf16) from None


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
            line = utf8_text(raw, number)
        except NotUTF8 as err:
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
    """``data`` (a ``str``: as UTF-8) into ``path`` atomically (``replace_atomic``): a reader
    sees the old file or the new one, never half of one."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    replace_atomic(path, lambda tmp: tmp.write_bytes(raw))


def write_jsonl_atomic(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """``rows`` as JSON lines (UTF-8, not ASCII-escaped, each newline-terminated) into ``path``
    atomically (``write_atomic``)."""
    write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def replace_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """The one atomic write of a file: ``write(tmp)`` fills a temporary file beside ``path``
    (named for this process and thread, so concurrent writers never share one), which is synced
    to disk and renamed over ``path``; on any failure the temporary file is removed and ``path``
    is as it was. An ``OSError`` that names no file (a full disk's write) names ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.filename is None and err.strerror is not None:
            err.filename = str(path)
        raise


def _torn(path: str | Path, number: int, line: str, stacklevel: int) -> None:
    warnings.warn(
        f"{path}:{number}: dropped a torn last line (a write cut short): {line[:80]!r}",
        stacklevel=stacklevel + 1,
    )
