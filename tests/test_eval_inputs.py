"""Bad caption input for `eval coverage`, `eval coco` and `eval chair`: every record is scored,
or left out with a count and its image id named; a class list naming a class twice is refused."""

import json
import re
import shutil

import pytest

from edgecap.errors import EdgecapError
from edgecap.metrics.captions import read_captions
from tests.test_eval_cli import write_acvr

RECORDS = (b'{"image_id": 1, "caption": "a cup on a table"}\n'
           b'{"image_id": 2, "caption": 42}\n'
           b'{"image_id": 3, "caption": "a bottle \xff\xfe of water"}\n'
           b'{"image_id": 4, "caption": ""}\n'
           b'{"image_id": 5}\n')


@pytest.mark.parametrize("layout", ["jsonl", "json"])
def test_a_number_is_malformed_and_undecodable_bytes_a_named_skip(tmp_path, layout):
    path = tmp_path / f"c.{layout}"
    if layout == "jsonl":
        path.write_bytes(RECORDS)
    else:
        path.write_bytes(b"[" + b",".join(RECORDS.splitlines()) + b"]")
    cap = read_captions(path)
    assert cap.captions == {"1": "a cup on a table", "4": "", "5": ""}
    assert cap.counts["malformed_records"] == 1 and cap.counts["non_utf8_records"] == 1
    assert cap.counts["empty_captions"] == 2 and cap.counts["missing_caption"] == 1
    assert cap.skipped == {"caption not a string": ["2"], "caption bytes not UTF-8": ["3"]}
    assert cap.skip_lines() == [f"{path}: 1 record skipped, caption not a string: '2'",
                                f"{path}: 1 record skipped, caption bytes not UTF-8: '3'"]


def test_a_u_fffd_the_file_spells_out_is_a_caption_like_any(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"image_id": 1, "caption": "a cup \ufffd"}]), encoding="utf-8")
    assert read_captions(path).captions == {"1": "a cup \ufffd"}


def test_chair_names_the_records_it_left_out(tmp_path, capsys):
    from edgecap.cli import main

    pytest.importorskip("spacy")
    instances = tmp_path / "instances.json"
    instances.write_text(json.dumps({"images": [{"id": i} for i in range(1, 6)],
                                     "categories": [{"id": 47, "name": "cup"}],
                                     "annotations": [{"image_id": 1, "category_id": 47}]}))
    preds = tmp_path / "p.jsonl"
    preds.write_bytes(RECORDS)
    assert main(["eval", "chair", "--captions", str(preds), "--instances", str(instances),
                 "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert f"{preds}: 1 record skipped, caption bytes not UTF-8: '3'" in err
    assert f"{preds}: 1 record skipped, caption not a string: '2'" in err
    doc = json.loads((tmp_path / "o" / "chair.json").read_text())
    assert sorted(doc["files"]["p"]["captions"]) == ["1", "4", "5"]


def test_coco_names_the_records_it_left_out(tmp_path, capsys):
    from edgecap.cli import main

    pytest.importorskip("pycocoevalcap")
    if shutil.which("java") is None:
        pytest.skip("java needed")
    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [
        {"cocoid": i, "filename": f"{i}.jpg", "split": "test", "sentences": [{"raw": "A cup on a table."}]}
        for i in range(1, 6)]}))
    preds = tmp_path / "p.jsonl"
    preds.write_bytes(RECORDS)
    assert main(["eval", "coco", "--captions", str(preds), "--refs", str(refs), "--no-meteor"]) == 0
    out = capsys.readouterr()
    assert f"{preds}: 1 record skipped, caption bytes not UTF-8: '3'" in out.err
    assert "3 images scored" in out.out


def test_odd_captions_are_scored_and_counted(tmp_path, capsys):
    """Empty, punctuation only, 10,000 characters, not English: each is an image scored."""
    from edgecap.cli import main

    pytest.importorskip("spacy")
    acvr = write_acvr(tmp_path / "acvr")
    preds = tmp_path / "odd.json"
    preds.write_text(json.dumps([
        {"image_id": "000000/000000", "caption": ""},
        {"image_id": "000000/000001", "caption": "?!... ,;"},
        {"image_id": "000001/000000", "caption": "a cup and a bowl on a table " * 358},
        {"image_id": "000001/000001", "caption": "猫がテーブルの上にいる"},
    ]))
    assert main(["eval", "coverage", "--captions", str(preds), "--acvr", str(acvr), "--out", str(tmp_path / "o"),
                 "--no-plot"]) == 0
    doc = json.loads((tmp_path / "o" / "coverage.json").read_text())["files"]["odd"]
    assert doc["summary"]["counts"]["images"] == 4
    assert doc["summary"]["counts"]["empty_captions"] == 1
    assert doc["summary"]["counts"]["captions_without_nouns"] == 1
    images = doc["images"]
    assert images["000000/000000"]["coverage"][">1%"] == 0.0          # {cup, laptop}: no nouns
    assert images["000000/000001"]["coverage"][">1%"] == 0.0          # {bottle}
    assert images["000001/000001"]["coverage"][">1%"] == 0.0          # {television, couch}
    assert images["000001/000000"]["coverage"][">1%"] is None         # no objects
    assert images["000001/000000"]["nouns"] == ["cup", "bowl", "table"]
    assert "4 images scored, 1 empty captions, 1 without nouns" in capsys.readouterr().out


@pytest.mark.parametrize("names, message", [
    (["cup", "bowl", "cup"], "class name 'cup' appears twice (ids 1 and 3)"),
    (["cup", " Bowl ", "bowl"], "class name 'bowl' appears twice (ids 2 and 3)"),
    (["cup", "  ", "bowl"], "categories[1] 'name': expected a class name, got '  '"),
])
def test_a_categories_file_naming_a_class_twice_or_not_at_all_is_refused(tmp_path, names, message, capsys):
    from edgecap.cli import main
    from edgecap.data.coco_categories import load_categories

    path = tmp_path / "cats.json"
    path.write_text(json.dumps({"categories": [{"id": i + 1, "name": n} for i, n in enumerate(names)]}))
    with pytest.raises(EdgecapError, match=re.escape(message)):
        load_categories(path)
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"frame_id": 0, "source": "cam", "caption": "a cup",
                                   "objects": [{"class": "cup", "box": [0, 0, 1, 1], "area": 0.2}]}) + "\n")
    assert main(["eval", "coverage", "--records", str(records), "--classes", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err


def test_eval_coverage_classes_nosuch_lists_the_class_sets_and_speaks_of_classes(tmp_path, capsys):
    """It said `--categories nosuch: ...` (another command's flag) and did not name acvr / coco."""
    from edgecap.cli import main

    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"frame_id": 0, "source": "cam", "caption": "a cup",
                                   "objects": [{"class": "cup", "box": [0, 0, 1, 1], "area": 0.2}]}) + "\n")
    assert main(["eval", "coverage", "--records", str(records), "--classes", "nosuch", "--no-plot"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "edgecap eval: error: --classes nosuch: not a class set (acvr, coco) and no such file (a COCO annotation "
        "JSON or a YOLO data.yaml)"]
    assert main(["eval", "coverage", "--records", str(records), "--classes", "COCO80", "--no-plot"]) == 1
    assert "not a class set (acvr, coco) (did you mean 'coco'?)" in capsys.readouterr().err
    (tmp_path / "cats.json").write_text("{}")
    assert main(["eval", "coverage", "--records", str(records), "--classes", str(tmp_path / "cats.json")]) == 1
    assert f"--classes {tmp_path / 'cats.json'}:" in capsys.readouterr().err


def test_tv_and_television_in_one_list_are_one_class_twice(tmp_path):
    from edgecap.metrics.vocabulary import load_vocabulary

    path = tmp_path / "data.yaml"
    path.write_text("names: [tv, cup, television]\n")
    with pytest.raises(EdgecapError, match="class name 'television' appears twice \\(as 'tv'\\)"):
        load_vocabulary(str(path))


def test_a_caption_that_is_a_number_in_a_recorded_run_is_malformed(tmp_path, capsys):
    from edgecap.cli import main

    pytest.importorskip("spacy")
    records = tmp_path / "r.jsonl"
    obj = [{"class": "cup", "box": [0, 0, 1, 1], "area": 0.2}]
    records.write_text("".join(json.dumps({"frame_id": i, "source": "cam", "caption": c, "objects": obj}) + "\n"
                               for i, c in enumerate(["a cup", 7, None])))
    assert main(["eval", "coverage", "--records", str(records), "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    doc = json.loads((tmp_path / "o" / "coverage.json").read_text())["files"]["r"]
    assert doc["summary"]["counts"]["images"] == 2 and doc["summary"]["counts"]["malformed_captions"] == 1
    assert doc["summary"]["counts"]["empty_captions"] == 1
    assert "1 malformed (caption not a string)" in capsys.readouterr().out
