"""``common.jsonl``'s text rule for the logs a run appends to: a UTF-8 byte order mark is read
past, a byte that is not UTF-8 names its line and its byte in the line."""

import pytest

from common.jsonl import NotUTF8, read_jsonl, utf8_text


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
