"""`--detections` as COCO detection results, built the way detectron2's COCOEvaluator,
mmdetection's `--format-only` and ultralytics' `val save_json=True` build them: class names
from COCO's ids or `--categories`, `--min-score`, image_id -> folder file stem, mask areas from
the RLE, and the one-line refusals."""

import io
import json

import cv2
import numpy as np
import pytest
from runtime_helpers import FakeBundle, solid

from edgecap.data.coco_categories import COCO_CATEGORIES, load_categories
from edgecap.errors import EdgecapError
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, execute
from edgecap.runtime.detections import Detections

RED, GREEN = (0, 0, 255), (0, 255, 0)  # BGR; FakeBundle captions them "a red cup", "a green cup"


def detectron2_results(instances, contiguous_to_dataset):
    """As detectron2's instances_to_coco_json + COCOEvaluator: XYXY boxes converted to XYWH,
    tolist() floats, RLE counts decoded to str, contiguous class ids mapped back to the
    dataset's ids."""
    from pycocotools import mask as mask_util

    results = []
    for image_id, xyxy, scores, classes, masks in instances:
        boxes = np.asarray(xyxy, dtype=np.float32)
        boxes[:, 2:] -= boxes[:, :2]
        for k, box in enumerate(boxes.tolist()):
            result = {"image_id": image_id, "category_id": contiguous_to_dataset[classes[k]],
                      "bbox": box, "score": float(np.float32(scores[k]))}
            if masks is not None:
                rle = mask_util.encode(np.array(masks[k][:, :, None], order="F", dtype="uint8"))[0]
                rle["counts"] = rle["counts"].decode("utf-8")
                result["segmentation"] = rle
            results.append(result)
    return results


def ultralytics_results(predictions, class_map):
    """As ultralytics' DetectionValidator.pred_to_json: image_id int(stem) when numeric, else
    the stem; xywh with a top-left corner rounded to 3 decimals; score rounded to 5."""
    results = []
    for file_name, xyxy, conf, cls in predictions:
        stem = file_name.rsplit(".", 1)[0]
        box = np.asarray(xyxy, dtype=np.float32)
        xywh = np.concatenate([(box[:, :2] + box[:, 2:]) / 2, box[:, 2:] - box[:, :2]], axis=1)
        xywh[:, :2] -= xywh[:, 2:] / 2
        for b, s, c in zip(xywh.tolist(), conf, cls, strict=True):
            results.append({"image_id": int(stem) if stem.isnumeric() else stem, "file_name": file_name,
                            "category_id": class_map[int(c)], "bbox": [round(x, 3) for x in b],
                            "score": round(s, 5)})
    return results


def mmdet_results(per_image, cat_ids):
    """As mmdetection's CocoDataset._det2json: per image, per label, [x1, y1, x2, y2, score]
    rows turned into xywh with w = x2 - x1."""
    results = []
    for img_id, per_label in per_image:
        for label, rows in enumerate(per_label):
            for row in rows:
                x1, y1, x2, y2, score = (float(v) for v in row)
                results.append({"image_id": img_id, "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "score": score, "category_id": cat_ids[label]})
    return results


def _folder(tmp_path, names):
    folder = tmp_path / "frames"
    folder.mkdir()
    for name, colour in names:
        cv2.imwrite(str(folder / name), solid(colour, size=20))
    return folder


def _run(tmp_path, folder, results, **settings):
    det = tmp_path / "coco_instances_results.json"
    det.write_text(json.dumps(results))
    jsonl = tmp_path / "run.jsonl"
    execute(Captioner(FakeBundle()), RunSettings(source=str(folder), jsonl=str(jsonl), detections=str(det),
                                                 coverage=False, **settings), out=io.StringIO())
    return {r["image_id"]: r for r in map(json.loads, jsonl.read_text().splitlines())}


def test_detectron2_results_name_folder_images_by_their_numeric_stem(tmp_path, capsys):
    folder = _folder(tmp_path, [("000000000139.png", RED), ("000000391895.png", GREEN)])
    mask = np.zeros((20, 20), np.uint8)
    mask[2:7, 3:11] = 1  # 40 px of 400 inside a 10x10 box
    results = detectron2_results([
        # a COCO-trained model: contiguous ids 0..79 mapped back to 1..90 (39 -> bottle 44, 62 -> tv 72)
        (139, [[0, 0, 10, 10], [5, 5, 15, 15]], [0.98, 0.2], [39, 62], [mask, mask]),
        (391895, [[0, 0, 20, 20]], [0.7], [62], [mask]),
        (555, [[0, 0, 5, 5]], [0.9], [0], None),  # an image that is not in the folder
    ], dict(enumerate(sorted(COCO_CATEGORIES))))
    recs = _run(tmp_path, folder, results)
    assert recs["000000000139.png"]["objects"] == [
        {"class": "bottle", "box": [0.0, 0.0, 9.0, 9.0], "area": 0.25, "box_area": 0.25, "pixel_area": 0.1}]
    # "tv" is COCO's spelling; the whole frame's box is the whole frame
    assert [(o["class"], o["area"]) for o in recs["000000391895.png"]["objects"]] == [("television", 1.0)]
    err = capsys.readouterr().err
    assert "skipped 1 under --min-score 0.5" in err
    assert "1 of 3 image_ids matched no captioned frame (555)" in err


def test_pixel_area_comes_from_the_rle(tmp_path):
    folder = _folder(tmp_path, [("000000000139.png", RED)])
    mask = np.zeros((20, 20), np.uint8)
    mask[2:7, 3:11] = 1
    results = detectron2_results([(139, [[0, 0, 10, 10]], [0.9], [0], [mask])], {0: 1})
    recs = _run(tmp_path, folder, results, area="pixels")
    assert [(o["class"], o["area"]) for o in recs["000000000139.png"]["objects"]] == [("person", 0.1)]


def test_ultralytics_results_with_string_stems_and_a_data_yaml(tmp_path, capsys):
    folder = _folder(tmp_path, [("kitchen_01.png", RED), ("0042.png", GREEN)])
    yaml_file = tmp_path / "data.yaml"
    yaml_file.write_text("path: ../datasets/kitchen\ntrain: images/train\nval: images/val\n"
                         "names:\n  0: mug\n  1: tvmonitor\n  2: sofa\n")
    predictions = [("kitchen_01.png", [[2.0, 3.0, 12.0, 13.0]], [0.91234567], [0]),
                   ("0042.png", [[0.0, 0.0, 10.0, 20.0], [1.0, 1.0, 2.0, 2.0]], [0.6, 0.01], [1, 2])]
    # current ultralytics numbers a custom dataset's classes from 1 ...
    recs = _run(tmp_path, folder, ultralytics_results(predictions, list(range(1, 4))),
                categories=str(yaml_file))
    assert [(o["class"], o["box"]) for o in recs["kitchen_01.png"]["objects"]] == [("mug", [2.0, 3.0, 11.0, 12.0])]
    assert [(o["class"], o["area"]) for o in recs["0042.png"]["objects"]] == [("television", 0.5)]
    # ... older releases from 0, which the 0 in the file gives away
    older = _run(tmp_path, folder, ultralytics_results(predictions, list(range(3))), categories=str(yaml_file),
                 min_score=0.0)
    assert [o["class"] for o in older["0042.png"]["objects"]] == ["television", "couch"]
    assert "matched no captioned frame" not in capsys.readouterr().err


def test_mmdetection_results_with_an_annotation_files_categories(tmp_path):
    folder = _folder(tmp_path, [("7.png", RED)])
    ann = tmp_path / "instances_val.json"
    ann.write_text(json.dumps({"images": [{"id": 7, "file_name": "7.png", "width": 20, "height": 20}],
                               "annotations": [],
                               "categories": [{"id": 3, "name": "coffee_mug", "supercategory": "kitchen"},
                                              {"id": 9, "name": "Wine Glass", "supercategory": "kitchen"}]}))
    results = mmdet_results([(7, [np.array([[0, 0, 10, 10, 0.8]]), np.array([[0, 0, 4, 5, 0.55], [0, 0, 4, 0, 0.9]])])],
                            [3, 9])
    recs = _run(tmp_path, folder, results, categories=str(ann))
    # class names normalised as everywhere (underscores, case); the zero-height box is skipped
    assert [(o["class"], o["area"]) for o in recs["7.png"]["objects"]] == [("coffee mug", 0.25), ("wine glass", 0.05)]


def test_a_video_frame_is_its_index(tmp_path):
    det = tmp_path / "r.json"
    det.write_text(json.dumps([{"image_id": 3, "category_id": 47, "bbox": [0, 0, 10, 10], "score": 0.9},
                               {"image_id": "3", "category_id": 51, "bbox": [0, 0, 20, 20], "score": 0.9}]))
    objects = Detections(det).objects(3, 20, 20)
    assert [(o.cls, o.area) for o in objects] == [("cup", 0.25), ("bowl", 1.0)]
    assert Detections(det).objects(4, 20, 20) is None


def _refusal(tmp_path, records, categories=None):
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(records))
    with pytest.raises(EdgecapError) as info:
        Detections(path, categories=load_categories(categories) if categories else None)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


GOOD = {"image_id": 1, "category_id": 47, "bbox": [0, 0, 5, 5], "score": 0.9}


@pytest.mark.parametrize("record, expected", [
    ({**GOOD, "category_id": 12}, "[1]: category_id 12 is not in COCO's 80 categories (ids 1-90); give the dataset's --categories FILE"),
    ({**GOOD, "bbox": [0, 0, 5]}, "[1]: 'bbox' must be [x, y, width, height], got [0, 0, 5]"),
    ({**GOOD, "bbox": [0, 0, float("nan"), 5]}, "[1] 'bbox': expected a finite number, got nan"),
    ({**GOOD, "score": float("inf")}, "[1] 'score': expected a finite number, got inf"),
    ({**GOOD, "bbox": [0, 0, -3, 5]}, "negative width or height"),
    ({**GOOD, "image_id": None}, "'image_id' must be an integer or a file stem, got None"),
    ({**GOOD, "category_id": "cup"}, "'category_id' must be an integer, got 'cup'"),
    ({**GOOD, "segmentation": {"counts": "abc"}}, "'segmentation' must be an RLE"),
])
def test_bad_results_are_one_line_naming_the_record(tmp_path, record, expected):
    assert expected in _refusal(tmp_path, [GOOD, record])


def test_ids_matching_no_category_list_are_refused(tmp_path):
    ann = tmp_path / "instances.json"
    ann.write_text(json.dumps({"categories": [{"id": 1, "name": "cup"}, {"id": 2, "name": "bowl"}]}))
    assert "category_id 47 is not in" in _refusal(tmp_path, [GOOD], categories=ann)
    (tmp_path / "bad.json").write_text(json.dumps({"images": []}))
    with pytest.raises(EdgecapError, match="no \"categories\" list"):
        load_categories(tmp_path / "bad.json")


def test_an_array_that_is_not_results_is_refused(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"frame_id": 0, "objects": []}]))
    with pytest.raises(EdgecapError, match="a JSON array, but not COCO detection results"):
        Detections(path)


def test_coco_flags_without_detections_and_a_score_out_of_range_are_refused(tmp_path, run_cli):
    folder = _folder(tmp_path, [("1.png", RED)])
    code, _, err = run_cli("run", tmp_path / "no-bundle", "--source", folder, "--min-score", "1.5",
                           "--detections", tmp_path / "x.json")
    assert code == 2 and "--min-score" in err and "1.5" in err
    with pytest.raises(EdgecapError, match=r"--min-score 1.5: expected"):  # as a --config file gives it
        execute(Captioner(FakeBundle()), RunSettings(source=str(folder), min_score=1.5))
    with pytest.raises(EdgecapError, match="--categories applies to a --detections file"):
        execute(Captioner(FakeBundle()), RunSettings(source=str(folder), categories="data.yaml"))


def test_edgecap_run_with_a_bundle_over_coco_results_and_eval_coverage_of_the_run(tmp_path, run_cli):
    """The user's whole path: an exported bundle captions a folder of COCO-named images with a
    detector's results file; `eval coverage --records` re-scores the run from its records."""
    pytest.importorskip("torch")
    pytest.importorskip("spacy")
    from tests._export_util import export, save_tiny

    ckpt = save_tiny(tmp_path / "tiny.pt", "smart",
                     visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]}, n_regions=16)
    export(ckpt, tmp_path / "bundle")
    folder = _folder(tmp_path, [("000000000139.png", RED), ("000000000285.png", GREEN), ("000000000632.png", RED)])
    det = tmp_path / "coco_instances_results.json"
    det.write_text(json.dumps(detectron2_results([
        (139, [[0, 0, 10, 10], [0, 0, 20, 20]], [0.9, 0.8], [41, 62], None),   # cup, tv
        (285, [[4, 4, 8, 8]], [0.3], [45], None),                              # bowl, under 0.5
        (9999, [[0, 0, 5, 5]], [0.9], [0], None),
    ], dict(enumerate(sorted(COCO_CATEGORIES))))))
    jsonl = tmp_path / "run.jsonl"
    code, stdout, err = run_cli("run", tmp_path / "bundle", "--source", folder, "--detections", det,
                                "--jsonl", jsonl, "--quiet")
    assert code == 0, err
    assert "1 of 3 image_ids matched no captioned frame (9999)" in err
    recs = {r["image_id"]: r for r in map(json.loads, jsonl.read_text().splitlines())}
    assert [o["class"] for o in recs["000000000139.png"]["objects"]] == ["cup", "television"]
    assert set(recs["000000000139.png"]["coverage"]) == {">1%", ">3%", ">5%", ">10%"}
    assert recs["000000000285.png"]["objects"] == [] and recs["000000000632.png"].get("objects") is None
    out = tmp_path / "eval"
    code, _, err = run_cli("eval", "coverage", "--records", jsonl, "--out", out, "--no-plot")
    assert code == 0, err
    row = next(iter(json.loads((out / "coverage.json").read_text())["files"].values()))
    assert row["summary"]["counts"]["records"] == 3 and row["summary"]["counts"]["records_without_objects"] == 1
    assert row["images"]["000000000139.png"]["gt"] == {"cup": 0.25, "television": 1.0}
    assert row["summary"]["thresholds"][">10%"]["mean"] == recs["000000000139.png"]["coverage"][">10%"]


def test_category_base_overrides_the_id_rule_both_ways(tmp_path):
    """--category-base 0|1 reads category_id as a class index from that base, for COCO's 80
    classes (a COCO-trained YOLO on a dataset it does not know as COCO writes 0..79 or 1..80)
    and for a data.yaml; auto keeps COCO's own 1..90 ids and the data.yaml rule."""
    folder = _folder(tmp_path, [("1.png", RED)])
    results = [{"image_id": 1, "category_id": 80, "bbox": [0, 0, 5, 5], "score": 0.9},
               {"image_id": 1, "category_id": 1, "bbox": [0, 0, 10, 10], "score": 0.9}]

    def classes(**settings):
        return [o["class"] for o in _run(tmp_path, folder, results, **settings)["1.png"]["objects"]]

    assert classes() == classes(category_base="auto") == ["toaster", "person"]  # COCO ids 80, 1
    assert classes(category_base="1") == ["toothbrush", "person"]               # 80th and 1st class
    results[0]["category_id"] = 79
    assert classes(category_base="0") == ["toothbrush", "bicycle"]              # 80th and 2nd class
    yaml_file = tmp_path / "data.yaml"
    yaml_file.write_text("names: [mug, tvmonitor, sofa]\n")
    results = [{"image_id": 1, "category_id": k, "bbox": [0, 0, 5, 5], "score": 0.9} for k in (1, 2)]
    assert classes(categories=str(yaml_file)) == ["mug", "television"]          # auto: no 0, so from 1
    assert classes(categories=str(yaml_file), category_base="1") == ["mug", "television"]
    assert classes(categories=str(yaml_file), category_base="0") == ["television", "couch"]


def test_category_base_zero_refuses_an_id_past_the_last_class(tmp_path):
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps([{"image_id": 1, "category_id": 80, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    with pytest.raises(EdgecapError, match=r"category_id 80 is not in COCO's 80 categories, ids as class "
                                           r"indices from 0 \(ids 0-79\); give the dataset's --categories FILE$"):
        Detections(path, category_base="0")


def test_category_base_is_checked_on_the_command_line_and_in_a_config(tmp_path, run_cli):
    folder = _folder(tmp_path, [("1.png", RED)])
    code, _, err = run_cli("run", tmp_path / "no-bundle", "--source", folder, "--category-base", "2")
    assert code == 2 and "--category-base" in err and "'2'" in err
    config = tmp_path / "robot.toml"
    config.write_text(f'bundle = "b"\nsource = "{folder}"\ncategory_base = "one"\n')
    code, _, err = run_cli("run", "--config", config)
    assert code == 1 and "category_base = 'one'" in err
    jsonl = tmp_path / "objects.jsonl"
    jsonl.write_text('{"frame_id": 0, "objects": []}\n')
    with pytest.raises(EdgecapError, match="--category-base applies to COCO detection results"):
        execute(Captioner(FakeBundle()), RunSettings(source=str(folder), detections=str(jsonl), category_base="1"))


def test_unmatched_image_ids_go_into_the_summary(tmp_path):
    folder = _folder(tmp_path, [("139.png", RED), ("285.png", GREEN)])
    results = [{"image_id": i, "category_id": 47, "bbox": [0, 0, 5, 5], "score": 0.9} for i in (139, 555, 9, 777)]
    _run(tmp_path, folder, results)
    summary = json.loads((tmp_path / "run.summary.json").read_text())
    assert summary["detections"] == {"path": str(tmp_path / "coco_instances_results.json"), "format": "coco results",
                                     "ids": 4, "unmatched_ids": 3, "unmatched_examples": [9, 555, 777],
                                     "boxes_outside_frame": 0}


def test_a_detectors_boxes_past_the_frame_edge_are_clipped_and_one_wholly_outside_is_dropped(tmp_path, capsys):
    """COCO [-50, -50, 60, 60] on a 96 x 96 frame was recorded as [-50, -50, 9, 9] with area 0.39;
    only 10 x 10 pixels of it are in view. [5000, 5000, 60, 60] counted as in view at every threshold."""
    folder = tmp_path / "frames"
    folder.mkdir()
    cv2.imwrite(str(folder / "139.png"), solid(RED, size=96))
    results = [{"image_id": 139, "category_id": 47, "bbox": [-50, -50, 60, 60], "score": 0.9},     # cup
               {"image_id": 139, "category_id": 51, "bbox": [5000, 5000, 60, 60], "score": 0.9},   # bowl
               {"image_id": 139, "category_id": 44, "bbox": [90, 40, 30, 10], "score": 0.9}]       # bottle
    recs = _run(tmp_path, folder, results)
    assert recs["139.png"]["objects"] == [
        {"class": "cup", "box": [0.0, 0.0, 9.0, 9.0], "area": round(100 / 96**2, 6), "box_area": round(100 / 96**2, 6)},
        {"class": "bottle", "box": [90.0, 40.0, 95.0, 49.0], "area": round(60 / 96**2, 6),
         "box_area": round(60 / 96**2, 6)}]
    summary = json.loads((tmp_path / "run.summary.json").read_text())
    assert summary["detections"]["boxes_outside_frame"] == 1
    assert "1 box lay wholly outside the captioned frame: left out" in capsys.readouterr().err


def test_clipping_is_by_inclusive_pixels_at_every_edge():
    from edgecap.contract.objects import clip_box, objects_in_view

    assert clip_box((-50, -50, 9, 9), 96, 96) == (0.0, 0.0, 9.0, 9.0)
    assert clip_box((90, 90, 200, 95), 96, 96) == (90.0, 90.0, 95.0, 95.0)
    assert clip_box((96, 0, 120, 10), 96, 96) is None          # starts just past the right edge
    assert clip_box((-20, 0, -1, 10), 96, 96) is None          # ends just before the left edge
    assert clip_box((-20, 0, 0, 10), 96, 96) == (0.0, 0.0, 0.0, 10.0)  # one column in view
    objects, outside = objects_in_view([("cup", (-5, -5, 4, 4), None), ("bowl", (0, 200, 5, 300), 0.2)], 10, 10)
    assert [(o.cls, o.box, o.area) for o in objects] == [("cup", (0.0, 0.0, 4.0, 4.0), 0.25)] and outside == 1


def test_a_results_file_naming_no_image_of_the_folder_is_refused_before_the_run(tmp_path):
    folder = _folder(tmp_path, [("kitchen_01.png", RED), ("kitchen_02.png", GREEN)])
    det = tmp_path / "coco_instances_results.json"
    det.write_text(json.dumps([{"image_id": i, "category_id": 47, "bbox": [0, 0, 5, 5], "score": 0.9}
                               for i in (139, 285, 632, 724)]))
    bundle = FakeBundle()
    with pytest.raises(EdgecapError) as info:
        execute(Captioner(bundle), RunSettings(source=str(folder), detections=str(det), jsonl=str(tmp_path / "r.jsonl")),
                out=io.StringIO())
    message = str(info.value)
    assert "\n" not in message
    assert (f"none of its 4 image_ids (139, 285, 632, ...) is one of the file stems of its 2 images in {folder} "
            "('kitchen_01', 'kitchen_02')") in message
    assert bundle.seen_batches == [] and not (tmp_path / "r.jsonl").exists()  # nothing captioned or written
    lines = tmp_path / "objects.jsonl"  # edgecap's JSON Lines: frame_ids are positions in the folder
    lines.write_text('{"frame_id": 5, "objects": []}\n')
    with pytest.raises(EdgecapError, match=r"none of its 1 frame_ids \(5\) is one of the positions of its 2 images"):
        execute(Captioner(FakeBundle()), RunSettings(source=str(folder), detections=str(lines)), out=io.StringIO())


def test_a_coco_annotation_file_given_as_detections_is_named_as_one(tmp_path):
    """It said "'frame_id' must be an integer"; the user had the ground truth, not a detector's output."""
    annotations = {"info": {"description": "val"}, "licenses": [],
                   "images": [{"id": 139, "file_name": "000000000139.jpg", "width": 20, "height": 20}],
                   "annotations": [{"id": 1, "image_id": 139, "category_id": 47, "bbox": [0, 0, 5, 5], "area": 25,
                                    "iscrowd": 0, "segmentation": [[0, 0, 5, 0, 5, 5, 0, 5]]}],
                   "categories": [{"id": 47, "name": "cup", "supercategory": "kitchen"}]}
    for indent in (None, 2):  # as written by json.dump, on one line or pretty-printed
        path = tmp_path / "instances_val2017.json"
        path.write_text(json.dumps(annotations, indent=indent))
        coco = pytest.importorskip("pycocotools.coco")
        assert coco.COCO(str(path)).getAnnIds() == [1]  # what pycocotools reads as ground truth
        with pytest.raises(EdgecapError) as info:
            Detections(path)
        assert str(info.value).startswith(f"--detections {path}: a COCO annotation file (ground truth: images, "
                                          "annotations, categories), not detector results")


def test_an_empty_results_array_means_the_detector_found_nothing(tmp_path):
    """`[]` is what detectron2's COCOEvaluator and ultralytics write when nothing was detected;
    it was refused as "not COCO detection results"."""
    folder = _folder(tmp_path, [("139.png", RED), ("285.png", GREEN)])
    recs = _run(tmp_path, folder, [])
    assert {k: r["objects"] for k, r in recs.items()} == {"139.png": [], "285.png": []}
    summary = json.loads((tmp_path / "run.summary.json").read_text())
    assert summary["detections"]["ids"] == 0 and summary["frames_captioned"] == 2
