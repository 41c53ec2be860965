"""tools/darknet_to_onnx.py on a small Darknet network written here in Darknet's own file
layouts (a cfg, a weights file: header, then per convolution its batch-norm or bias values and
its kernel): what the converted ONNX computes against the same network in numpy, and the
one-line refusals. Runs without the real weights (tests/test_detector_real.py has those)."""

import numpy as np
import pytest
from real_weights import tool

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

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
