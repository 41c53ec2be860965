"""Every JSON Lines file edgecap reads (caption logs, caption files, --detections) is read one
way (edgecap.jsonl): a byte order mark, a line separator inside a string and bytes that are not
UTF-8 are handled alike, and each reader keeps its own messages and counts."""

import json

import pytest

from edgecap.errors import EdgecapError

BOM = b"\xef\xbb\xbf"


def _lines(*objs) -> bytes:
    return b"".join(json.dumps(o, ensure_ascii=False).encode() + b"\n" for o in objs)


def test_a_caption_file_saved_with_a_byte_order_mark_keeps_its_first_record(tmp_path):
    from edgecap.metrics.captions import read_captions

    path = tmp_path / "caps.jsonl"  # PowerShell's Out-File -Encoding utf8, Notepad: BOM first
    path.write_bytes(BOM + _lines({"image_id": 1, "caption": "a cup"}, {"image_id": 2, "caption": "a bowl"}))
    cap = read_captions(path)
    assert cap.captions == {"1": "a cup", "2": "a bowl"}
    assert cap.counts["malformed_records"] == 0


def test_a_caption_log_with_a_byte_order_mark_keeps_its_first_run_marker(tmp_path):
    from edgecap.runtime.records import read_runs

    log = tmp_path / "run.jsonl"
    log.write_bytes(BOM + _lines({"kind": "run_start", "source": "s"}, {"frame_id": 0, "caption": "a"},
                                 {"kind": "run_end", "frames_captioned": 1}))
    runs, malformed = read_runs(log)
    assert malformed == 0
    assert [(r.start or {}).get("source") for r in runs] == ["s"] and runs[0].end is not None


def test_a_line_separator_inside_a_string_does_not_split_the_line(tmp_path):
    from edgecap.metrics.captions import read_captions
    from edgecap.runtime.detections import Detections

    caps = tmp_path / "caps.jsonl"  # U+2028 / U+0085 written as they are (ensure_ascii=False)
    caps.write_bytes(_lines({"image_id": 1, "caption": "a cup\u2028on a table"},
                            {"image_id": 2, "caption": "a bowl\x85"}))
    cap = read_captions(caps)
    assert cap.captions == {"1": "a cup\u2028on a table", "2": "a bowl\x85"}
    assert cap.counts["malformed_records"] == 0
    dets = tmp_path / "dets.jsonl"
    dets.write_bytes(_lines({"frame_id": 0, "detector": "yolo\u2028v8",
                             "objects": [{"class": "cup", "box": [0, 0, 9, 9]}]}))
    assert [o.cls for o in Detections(dets).objects(0, 20, 20)] == ["cup"]


def test_lenient_readers_count_what_is_not_an_object_and_keep_their_messages(tmp_path):
    from edgecap.metrics.captions import read_captions
    from edgecap.runtime.records import read_runs

    path = tmp_path / "dirty.jsonl"
    path.write_bytes(_lines({"frame_id": 0, "source": "s", "caption": "a"}) + b"7\n\n"
                     + b'{"frame_id": 1, "source": "s", "caption": "b \xff"}\n{"frame_id": 2, "cap')
    runs, malformed = read_runs(path)
    assert malformed == 2 and [r["caption"] for r in runs[0].records] == ["a", "b \ufffd"]
    counts = read_captions(path).counts
    assert (counts["malformed_records"], counts["non_utf8_records"], counts["records"]) == (2, 1, 2)
    with pytest.raises(EdgecapError, match=f"^{tmp_path}: cannot read caption log \\(Is a directory\\)$"):
        read_runs(tmp_path)
    with pytest.raises(EdgecapError, match=f"^{tmp_path}: cannot read caption file \\(Is a directory\\)$"):
        read_captions(tmp_path)


def test_detections_stop_at_the_first_bad_line_naming_it(tmp_path):
    from edgecap.runtime.detections import Detections

    path = tmp_path / "dets.jsonl"
    good = _lines({"frame_id": 0, "objects": []})
    for bad, message in ((b'{"frame_id": 1, "objects": [\xff]}\n', "not UTF-8 text"),
                         (b'{"frame_id": 1,\n', "invalid JSON: Expecting property name enclosed in double quotes"),
                         (b"[1]\n", "expected an object with frame_id and objects")):
        path.write_bytes(BOM + good + b"\n" + bad)
        with pytest.raises(EdgecapError) as err:
            Detections(path)
        assert str(err.value) == f"--detections {path}:3: {message}"  # the blank line 2 is counted
    with pytest.raises(EdgecapError, match="cannot read \\(No such file or directory\\)"):
        Detections(tmp_path / "missing.jsonl")
