"""Every JSON Lines file edgecap reads (caption logs, caption files, --detections) is read one
way (edgecap.jsonio): a byte order mark, a line separator inside a string and bytes that are not
UTF-8 are handled alike, and each reader keeps its own messages and counts."""

import json
import re

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
    from edgecap.contract.runlog import read_runs

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
    from edgecap.contract.runlog import read_runs
    from edgecap.metrics.captions import read_captions

    path = tmp_path / "dirty.jsonl"
    path.write_bytes(_lines({"frame_id": 0, "source": "s", "caption": "a"}) + b"7\n\n"
                     + b'{"frame_id": 1, "source": "s", "caption": "b \xff"}\n{"frame_id": 2, "cap')
    runs, malformed = read_runs(path)
    assert malformed == 2 and [r["caption"] for r in runs[0].records] == ["a", "b \ufffd"]
    counts = read_captions(path).counts
    # the caption that is not UTF-8 is counted and left out of what is scored
    assert (counts["malformed_records"], counts["non_utf8_records"], counts["records"]) == (2, 1, 1)
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


def test_json_documents_are_read_one_way(tmp_path):
    """labels.json, COCO references / instances and dataset_coco.json: a byte order mark is
    dropped, bytes that are not UTF-8 and broken JSON are one line naming file and place."""
    from edgecap.data.acvr import read_labels
    from edgecap.data.karpathy import load_karpathy
    from edgecap.metrics.chair import load_coco_instances
    from edgecap.metrics.coco import load_references

    labels = tmp_path / "labels.json"
    labels.write_bytes(BOM + json.dumps({"000000": {}}).encode())
    assert read_labels(labels) == {"000000": {}}
    refs = tmp_path / "captions_val2014.json"
    refs.write_bytes(BOM + json.dumps({"images": [{"id": 7, "file_name": "a.jpg"}],
                                       "annotations": [{"image_id": 7, "caption": "a cup"}]}).encode())
    got, _ = load_references(refs)
    assert list(got) == ["7"]
    karpathy = tmp_path / "dataset_coco.json"
    karpathy.write_bytes(b'{"images": [{"filename": "caf\xe9.jpg"}]}')  # Latin-1, as an old editor saved it
    with pytest.raises(EdgecapError) as err:
        load_karpathy(karpathy)
    assert str(err.value) == f"{karpathy}: not UTF-8 text (byte 29)"
    instances = tmp_path / "instances.json"
    instances.write_text('{"categories": [],\n "annotations": [,]}')
    with pytest.raises(EdgecapError) as err:
        load_coco_instances(instances)
    assert str(err.value) == f"{instances}: invalid JSON at line 2: Expecting value"
    with pytest.raises(EdgecapError, match=f"^{tmp_path / 'none.json'}: cannot read instances file "):
        load_coco_instances(tmp_path / "none.json")


def test_export_parity_reads_a_karpathy_file_with_a_byte_order_mark(tmp_path):
    # the parity gate's held-out images come from the checkpoint's dataset_coco.json
    from edgecap.export.verify import ParityData, _dataset_items

    path = tmp_path / "dataset_coco.json"
    doc = {"images": [{"filename": f"{i}.jpg", "split": split} for i, split in enumerate(("train", "val", "test"))]}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    found = ParityData(karpathy=path, images=None, features=None, label="training data")
    assert [im["filename"] for im in _dataset_items(found, 2)] == ["1.jpg", "2.jpg"]  # held-out first
    path.write_bytes(b'{"images": [{"filename": "caf\xe9.jpg"}]}')
    with pytest.raises(EdgecapError, match=rf"^parity data {re.escape(str(path))}: not UTF-8 text \(byte 29\)$"):
        _dataset_items(found, 2)
