"""``common.jsonl``'s text rule for the logs a run appends to: a UTF-8 byte order mark is read
past, a byte that is not UTF-8 names its line and its byte in the line."""

import threading

import pytest

from common.jsonl import (
    NotUTF8,
    read_jsonl,
    replace_atomic,
    utf8_text,
    write_atomic,
    write_jsonl_atomic,
)


def test_a_log_with_a_byte_order_mark_reads_and_a_bad_byte_names_its_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"step": 0}\n{"step": 1}\n')
    assert read_jsonl(path, "step") == [{"step": 0}, {"step": 1}]
    path.write_bytes(b'{"step": 0}\n{"x": "\xff"}\n{"step": 2}\n')
    with pytest.raises(ValueError) as err:
        read_jsonl(path, "step")
    assert str(err.value) == f"{path}:2: not UTF-8 text: line 2, byte 8 of the line is 0xff"


def test_utf8_text_counts_lines_and_bytes_from_one():
    assert utf8_text(b"\xef\xbb\xbfab") == "ab"
    with pytest.raises(NotUTF8) as err:
        utf8_text(b"a\nbc\n\xc3(", first_line=10)  # a lead byte without its continuation
    assert (err.value.line, err.value.byte, err.value.value) == (12, 1, 0xC3)


def test_write_jsonl_atomic_writes_utf8_lines_and_replaces_the_whole_file(tmp_path):
    path = tmp_path / "sub" / "rows.jsonl"
    write_jsonl_atomic(path, [{"q": "Zürich"}, {"n": 1}])
    assert path.read_bytes() == '{"q": "Zürich"}\n{"n": 1}\n'.encode()
    write_jsonl_atomic(path, [])
    assert path.read_bytes() == b""
    assert [p.name for p in path.parent.iterdir()] == ["rows.jsonl"]  # no temporary file left


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "state.json"
    write_atomic(path, "old")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as err:
        replace_atomic(path, half_then_fail)
    assert err.value.filename == str(path)  # a full disk's error names the file
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_concurrent_atomic_writes_of_one_file_each_land_whole(tmp_path):
    """Threads writing one file (an LLM client's cache entry) never share a temporary file."""
    path = tmp_path / "entry.json"
    texts = [str(i) * 10_000 for i in range(8)]
    threads = [threading.Thread(target=write_atomic, args=(path, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["entry.json"]
