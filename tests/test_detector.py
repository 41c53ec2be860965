"""The detector stage (`edgecap run --detector`) on small ONNX detectors made here
(tests/detector_models.py): known boxes through letterboxing, the score threshold, class-aware
NMS and clipping, every output layout, batches across cameras, class names, the run's records
and coverage, and the one-line refusals."""

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from detector_models import write_detector
from runtime_helpers import FakeBundle

from edgecap.data.coco_categories import load_categories
from edgecap.errors import EdgecapError
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, execute
from edgecap.runtime.detector import Detector

pytest.importorskip("onnx")

PERSON, CUP, TV = 0, 1, 2
# (class, (cx, cy, w, h) in the 320 x 320 input, score); a 640 x 480 frame is scaled by 0.5 into
# it with 40 grey rows above and below
BOXES = [
    (PERSON, (100, 140, 40, 60), 0.9),   # -> frame (160, 140)-(240, 260)
    (PERSON, (102, 142, 40, 60), 0.8),   # overlaps the first person: suppressed
    (CUP, (100, 140, 40, 60), 0.7),      # the same box, another class: kept
    (TV, (200, 200, 20, 20), 0.2),       # under the 0.25 threshold
    (CUP, (315, 200, 20, 40), 0.6),      # runs past the frame's right edge: clipped at 640
    (PERSON, (160, 20, 40, 20), 0.95),   # wholly in the grey border above the frame: nothing left
    (TV, (250, 250, 20, 20), 0.5),       # tvmonitor -> television
]
EXPECTED = [("person", (160, 140, 239, 259)), ("cup", (160, 140, 239, 259)), ("cup", (610, 280, 639, 359)),
            ("television", (480, 400, 519, 439))]


def _as_layout(layout):
    if layout != "end2end":
        return BOXES
    # the model's own NMS has run: boxes as x1, y1, x2, y2, the suppressed one gone
    return [(c, (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), s) for c, (cx, cy, w, h), s in BOXES
            if (c, s) != (PERSON, 0.8)]


def _frame(value, width=640, height=480):
    return np.full((height, width, 3), value, np.uint8)


def _found(objects):
    return [(o.cls, tuple(round(v) for v in o.box)) for o in objects]


@pytest.mark.parametrize("layout", ["yolo", "yolov5", "end2end"])
def test_known_boxes_come_back_in_the_frames_pixels(tmp_path, layout):
    path = tmp_path / f"{layout}.onnx"
    write_detector(path, _as_layout(layout), layout=layout, batch=2)
    detector = Detector.load(path)
    assert detector.layout == layout and detector.classes == ["person", "cup", "television"]
    white, black = detector.detect([_frame(255), _frame(0)])  # one batch, two cameras
    assert _found(white) == EXPECTED
    assert black == []  # its row's scores are scaled by its brightness: all below the threshold
    person = white[0]
    assert person.area == pytest.approx(80 * 120 / (640 * 480)) and person.box_area == person.area
    assert detector.latency_ms > 0


def test_threshold_and_nms_iou_are_the_users(tmp_path):
    path = tmp_path / "d.onnx"
    write_detector(path, BOXES)
    # a white 640 x 480 frame with its grey border has a mean of 0.86: scores 0.78, 0.60, 0.52, 0.43
    assert _found(Detector.load(path, min_score=0.55).detect([_frame(255)])[0]) == EXPECTED[:2]
    # at IoU 0.9 the two persons (IoU 0.82) are two objects
    persons = [o for o in Detector.load(path, iou=0.9).detect([_frame(255)])[0] if o.cls == "person"]
    assert len(persons) == 2


def test_every_frame_is_letterboxed_by_its_own_size_whatever_the_batch(tmp_path):
    """Static batch 1 runs the frames one at a time, a dynamic batch all at once; frames of
    different sizes (cameras) each get their own letterbox."""
    for batch in (1, "batch"):
        path = tmp_path / f"d{batch}.onnx"
        write_detector(path, [(CUP, (160, 160, 80, 80), 0.9)], batch=batch)
        detector = Detector.load(path)
        wide, square, grey = detector.detect([_frame(255, 640, 320), _frame(255, 160, 160), _frame(128)])
        assert _found(wide) == [("cup", (240, 80, 399, 239))]     # scaled by 0.5, 80 rows of border above
        assert _found(square) == [("cup", (60, 60, 99, 99))]      # scaled by 2, no border
        # a mid-grey frame scales the score by its brightness (with the grey border): still over 0.25
        assert [o.cls for o in grey] == ["cup"]


def test_class_names_from_metadata_or_a_data_yaml_and_the_refusals(tmp_path):
    bare = tmp_path / "bare.onnx"
    write_detector(bare, BOXES, names=None)
    with pytest.raises(EdgecapError, match=r"--detector .*bare.onnx: no class names.*--categories data.yaml"):
        Detector.load(bare)
    yaml = tmp_path / "data.yaml"
    yaml.write_text("names:\n  0: pedestrian\n  1: mug\n  2: monitor\n")
    named = Detector.load(bare, categories=load_categories(yaml))
    assert named.classes == ["pedestrian", "mug", "monitor"]
    assert [o.cls for o in named.detect([_frame(255)])[0]] == ["pedestrian", "mug", "mug", "monitor"]
    two = tmp_path / "two.yaml"
    two.write_text("names: [a, b]\n")
    with pytest.raises(EdgecapError, match=r"holds 3 class scores, and .*two.yaml names 2 classes"):
        Detector.load(bare, categories=load_categories(two))
    with pytest.raises(EdgecapError, match=r"--detector .*missing.onnx: no such file"):
        Detector.load(tmp_path / "missing.onnx")
    not_onnx = tmp_path / "notes.onnx"
    not_onnx.write_text("not a model")
    with pytest.raises(EdgecapError, match="onnxruntime cannot load"):
        Detector.load(not_onnx)


def _folder(tmp_path, name, frames):
    folder = tmp_path / name
    folder.mkdir()
    for i, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:03d}.png"), frame)
    return folder


def test_edgecap_run_with_a_detector_records_its_objects_latency_and_coverage(tmp_path):
    """A folder through `edgecap run --detector`: the FakeBundle captions a white frame "a red
    cup" (its first channel wins a tie), the detector finds a cup in it, so coverage is 1.0;
    in a black frame it finds nothing."""
    pytest.importorskip("spacy")
    path = tmp_path / "cups.onnx"
    write_detector(path, [(CUP, (160, 160, 80, 80), 0.9)])
    folder = _folder(tmp_path, "frames", [_frame(255, 320, 240), _frame(0, 320, 240)])
    jsonl = tmp_path / "run.jsonl"
    summary, error = execute(Captioner(FakeBundle(batch_size=1)), RunSettings(
        source=str(folder), detector=str(path), jsonl=str(jsonl), quiet=True))
    assert error is None and summary.captioned == 2
    first, second = (json.loads(line) for line in jsonl.read_text().splitlines())
    assert first["caption"] == "a red cup"
    assert [o["class"] for o in first["objects"]] == ["cup"] and second["objects"] == []
    assert first["coverage"][">1%"] == 1.0
    assert first["latency_ms"]["detector"] > 0 and set(first["latency_ms"]) >= {"visual", "decode", "detector"}
    report = json.loads((tmp_path / "run.summary.json").read_text())["detector"]
    assert report["layout"] == "yolo" and report["classes"] == 3 and report["min_score"] == 0.25


def test_several_cameras_share_one_detector_batch(tmp_path, monkeypatch):
    path = tmp_path / "cups.onnx"
    write_detector(path, [(CUP, (160, 160, 80, 80), 0.9)], batch=2)
    white = _folder(tmp_path, "white", [_frame(255, 320, 240)] * 2)
    black = _folder(tmp_path, "black", [_frame(0, 320, 240)] * 2)
    calls, detect = [], Detector.detect
    monkeypatch.setattr(Detector, "detect", lambda self, images: calls.append(len(images)) or detect(self, images))
    records = []
    summary, error = execute(Captioner(FakeBundle(batch_size=2)), RunSettings(
        source=[str(white), str(black)], detector=str(path), quiet=True, coverage=False),
        sinks=[lambda r: records.append(r.to_json())])
    assert error is None and summary.captioned == 4
    assert sorted((r["camera"], len(r["objects"])) for r in records) == [(0, 1), (0, 1), (1, 0), (1, 0)]
    # one detector run per round, of that round's frames (a round takes whichever cameras have one)
    assert len(calls) == summary.rounds and sum(calls) == 4
    assert all(r["latency_ms"]["detector"] > 0 for r in records)
    assert summary.to_json()["detector"]["input"] == [2, 3, 320, 320]


def test_detector_options_are_refused_in_one_line_where_they_do_not_apply(tmp_path, run_cli):
    path = tmp_path / "d.onnx"
    write_detector(path, BOXES)
    folder = _folder(tmp_path, "frames", [_frame(255, 32, 32)])
    captioner = Captioner(FakeBundle(batch_size=1))
    detections = tmp_path / "d.jsonl"
    detections.write_text('{"frame_id": 0, "objects": []}\n')
    for settings, message in (
            (RunSettings(source=str(folder), detector=str(path), detections=str(detections)),
             "--detector and --detections both give the frames' objects"),
            (RunSettings(source=str(folder), nms_iou=0.5), "--nms-iou applies to a --detector"),
            (RunSettings(source=str(folder), detector=str(path), category_base="1"),
             "--category-base applies to a --detections file"),
            (RunSettings(source=str(folder), detector=str(path), nms_iou=1.5), r"--nms-iou 1.5: expected")):
        with pytest.raises(EdgecapError, match=message):
            execute(captioner, settings)
    code, _, err = run_cli("run", tmp_path / "no-bundle", "--source", folder, "--detector", path, "--nms-iou", "2")
    assert code == 2 and "--nms-iou" in err


ULTRALYTICS = Path(__file__).parent / "data" / "ultralytics"


def test_an_ultralytics_export_gives_the_boxes_ultralytics_predicts():
    """tests/data/ultralytics/yolo11-tiny-random.onnx was made by ultralytics 8.4.190 itself: a
    YOLO11 of its own yaml at a tiny width (0.0625), 3 classes named person / cup / tv, random
    weights with BatchNorm statistics from noise images and a head scaled so scores differ,
    `export(format="onnx", imgsz=160, batch=2)`; beside it what its `predict(conf=0.25,
    iou=0.45, imgsz=160)` returned on two scikit-image photos. The detector stage reads the
    export's metadata and finds the same objects (class and box) in the same order."""
    from real_weights import photo, photos_dir

    reference = json.loads((ULTRALYTICS / "yolo11-tiny-random.predictions.json").read_text())
    for name, entry in reference["photos"].items():
        if hashlib.sha256((photos_dir() / name).read_bytes()).hexdigest() != entry["sha256"]:
            pytest.skip(f"scikit-image's {name} is not the photo ultralytics predicted on")
    detector = Detector.load(ULTRALYTICS / "yolo11-tiny-random.onnx", min_score=reference["conf"],
                             iou=reference["iou"])
    assert (detector.layout, detector.classes, detector.batch) == ("yolo", ["person", "cup", "television"], 2)
    names = list(reference["photos"])
    images = [photo(n) for n in names]
    for image, objects, name in zip(images, detector.detect(images), names, strict=True):
        theirs = reference["photos"][name]["detections"]
        assert len(objects) == len(theirs) > 10
        # ultralytics maps boxes back with an unrounded border (scale_boxes), the letterbox put the
        # image at the rounded one: up to one input pixel apart in the frame
        one_pixel = max(image.shape[:2]) / 160
        for ours, t in zip(objects, theirs, strict=True):
            assert ours.cls == {"tv": "television"}.get(t["class"], t["class"])
            x1, y1, x2, y2 = ours.box
            assert np.allclose([x1, y1, x2 + 1, y2 + 1], t["box"], atol=one_pixel), (name, ours.box, t["box"])
