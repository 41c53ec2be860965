"""Static int8 for a convolutional front end: QDQ visual graph calibrated on the user's images
(or the synthetic world), measured against fp32 at export time, fp32 kept where int8 does not
pay; the parity report's per-graph feature cosine; int8-only options refused elsewhere."""

import cv2
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from edgecap.contract.manifest import load_manifest
from edgecap.export import front_int8
from edgecap.export.formats import resolve_settings
from edgecap.runtime.session import Bundle
from tests._export_util import CNN, export, save_tiny


@pytest.fixture(scope="module")
def cnn_ckpt(tmp_path_factory):
    # "step" in its metadata: a checkpoint `edgecap train` wrote, so captions are compared too
    return save_tiny(tmp_path_factory.mktemp("cnn") / "cnn.pt", "smart", meta={"step": 1}, **CNN)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """A folder of camera-like images written by OpenCV, as a user would name one."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(4)
    for i in range(5):
        image = cv2.resize(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8), (64, 48), interpolation=cv2.INTER_CUBIC)
        cv2.imwrite(str(folder / f"frame{i:02d}.png"), image)
    (folder / "notes.txt").write_text("not an image")
    return folder


def _ops(path):
    return [n for n in onnx.load(str(path)).graph.node]


def test_front_end_int8_kept_where_it_pays(cnn_ckpt, photos, world, tmp_path, monkeypatch):
    # the speed and cosine bars lowered so the tiny CNN keeps int8 whatever this machine's load
    monkeypatch.setattr(front_int8, "FASTER_BY", float("inf"))
    monkeypatch.setattr(front_int8, "COSINE_FLOOR", -1.0)
    result = export(cnn_ckpt, tmp_path / "b", precision="int8", calibration=str(photos), data=str(world))
    m = load_manifest(result.path)
    assert m.graph("visual").precision == "int8"
    report = m.parity["onnxruntime"]
    record = report.front_end_int8
    assert record.precision == "int8" and record.reason.startswith("static int8: ")
    assert record.calibration == f"5 images of {photos}"
    assert record.evaluation == f"--data {world} (2 images)"  # the parity inputs: the checkpoint's data
    assert 0.0 <= record.caption_agreement <= 1.0  # trained checkpoint on its data: measured
    assert -1.0 <= record.centred_feature_cosine <= record.feature_cosine + 1.0
    assert record.fp32_ms > 0 and record.int8_ms > 0
    assert set(report.feature_cosine) == {"visual", "encoder"}
    # the graph as ONNX itself reads it: every Conv weight int8 with one symmetric scale per output
    # channel, activations uint8 with their zero points
    graph = onnx.load(str(result.path / "visual.onnx")).graph
    init = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert convs
    for conv in convs:
        weight_dq = producer[conv.input[1]]
        assert weight_dq.op_type == "DequantizeLinear"
        weight = numpy_helper.to_array(init[weight_dq.input[0]])
        scale = numpy_helper.to_array(init[weight_dq.input[1]])
        assert weight.dtype == np.int8 and scale.shape == (weight.shape[0],)
        assert not numpy_helper.to_array(init[weight_dq.input[2]]).any()
        act_dq = producer[conv.input[0]]
        assert act_dq.op_type == "DequantizeLinear"
        assert numpy_helper.to_array(init[act_dq.input[2]]).dtype == np.uint8
    # and the bundle captions with it
    bundle = Bundle.load(result.path, providers=["CPUExecutionProvider"])
    feats, _ = bundle.visual(np.zeros((bundle.batch_size, 3, 16, 16), np.float32))
    assert feats.shape == (bundle.batch_size, 16, 24) and np.isfinite(feats).all()
    assert not [p for p in result.path.iterdir() if p.name.startswith(".")]


def test_front_end_stays_fp32_where_int8_does_not_pay(cnn_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(front_int8, "FASTER_BY", 0.0)  # int8 can never be fast enough
    result = export(cnn_ckpt, tmp_path / "b", precision="int8")
    m = load_manifest(result.path)
    record = m.parity["onnxruntime"].front_end_int8
    assert m.graph("visual").precision == "fp32" and record.precision == "fp32"
    assert record.reason.startswith("kept fp32: int8 took ") and "more than 0% of it" in record.reason
    # no calibration folder named, no data: the synthetic world calibrates and evaluates; random
    # weights on noise parity inputs caption nothing worth comparing
    assert record.calibration == "16 synthetic-world frames (seed 0); none named with --calibration"
    assert record.evaluation == "8 synthetic-world frames (seed 1)" and record.caption_agreement is None
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in _ops(result.path / "visual.onnx")}
    assert m.graph("encoder").precision == "int8"  # the rest of the bundle is dynamic int8 as before
    # the fp32 front end is the export's fp32 graph, untouched: features equal an fp32 bundle's
    fp32 = export(cnn_ckpt, tmp_path / "fp32")
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    a = Bundle.load(result.path, providers=["CPUExecutionProvider"]).visual(x)[0]
    b = Bundle.load(fp32.path, providers=["CPUExecutionProvider"]).visual(x)[0]
    np.testing.assert_array_equal(a, b)
    assert fp32.parity["onnxruntime"].feature_cosine["visual"] > 0.9999
    assert fp32.parity["onnxruntime"].front_end_int8 is None


def test_low_feature_cosine_keeps_fp32_and_the_command_says_so(run_cli, cnn_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(front_int8, "FASTER_BY", float("inf"))
    monkeypatch.setattr(front_int8, "COSINE_FLOOR", 1.5)  # no int8 reaches it
    code, stdout, err = run_cli("export", cnn_ckpt, "--target", "cpu-ort-int8", "--samples", 1, "--out",
                                tmp_path / "b", "--quiet")
    assert code == 0, err
    record = load_manifest(tmp_path / "b").parity["onnxruntime"].front_end_int8
    assert record.precision == "fp32" and "feature cosine" in record.reason and "< 1.5" in record.reason
    assert f"  front end: {record.reason}" in stdout.splitlines()


def test_feature_cosine_centred_sees_what_plain_cosine_hides():
    from edgecap.export.verify import feature_cosine

    rng = np.random.default_rng(0)
    shared = rng.standard_normal(64) * 10
    a = shared + rng.standard_normal((4, 5, 64))  # every image nearly the same features
    b = shared + rng.standard_normal((4, 5, 64))  # image-specific parts all wrong
    assert feature_cosine(a, b) > 0.98
    assert abs(feature_cosine(a, b, centre=shared)) < 0.1
    assert feature_cosine(a, a, centre=a.mean(axis=0)) == pytest.approx(1.0)


def _one_line(code, err, *needles):
    assert code == 1, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_int8_options_that_do_not_apply_are_refused(run_cli, cnn_ckpt, photos, tmp_path):
    from tests._export_util import save_tiny as tiny

    features_ckpt = tiny(tmp_path / "feats.pt", "smart")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        ((cnn_ckpt, "--engine", "onnx", "--quantize", "static"),
         ["--quantize static applies to --precision int8", "this export is fp32"]),
        ((cnn_ckpt, "--engine", "onnx", "--precision", "fp16", "--calibration", photos),
         [f"--calibration {photos} applies to --precision int8", "this export is fp16"]),
        ((cnn_ckpt, "--engine", "onnx", "--precision", "int8", "--calibration", tmp_path / "nope"),
         [f"--calibration {tmp_path / 'nope'}: not a directory"]),
        ((cnn_ckpt, "--engine", "onnx", "--precision", "int8", "--calibration", empty, "--samples", 1),
         [f"--calibration {empty}: folder holds no images"]),
        ((features_ckpt, "--engine", "onnx", "--precision", "int8", "--calibration", photos, "--samples", 1),
         [f"--calibration {photos}: calibration images are for a bundle with a front end"]),
        ((cnn_ckpt, "--engine", "trt", "--precision", "int8", "--calibration", photos),
         ["does not take --calibration"]),
    ]
    for argv, needles in cases:
        code, _, err = run_cli("export", *argv, "--out", tmp_path / "b", "--quiet")
        _one_line(code, err, *needles)
        assert not (tmp_path / "b").exists()
    # a preset's own int8 options follow its precision: overriding it on the command line is fine
    settings = resolve_settings({"target": "cpu-ort-int8", "precision": "fp32"})
    assert settings.precision == "fp32"


def test_front_int8_benchmark_times_both_graphs_in_turns(cnn_ckpt, tmp_path, capsys):
    import json
    import sys

    from tests.conftest import REPO

    sys.path.insert(0, f"{REPO}/benchmarks")
    import front_end_int8 as bench

    fp32 = export(cnn_ckpt, tmp_path / "fp32").path
    int8 = export(cnn_ckpt, tmp_path / "int8", precision="int8").path
    assert bench.main([str(fp32), str(int8), "--runs", "2", "--warmup", "0", "--out", str(tmp_path / "out")]) == 0
    row = json.loads((tmp_path / "out" / "front_end_int8.json").read_text())["rows"][0]
    record = load_manifest(int8).parity["onnxruntime"].front_end_int8
    assert row["fp32_ms"] > 0 and row["int8_ms"] > 0 and row["speedup"] == pytest.approx(row["fp32_ms"] / row["int8_ms"])
    assert row["int8_precision"] == record.precision and row["feature_cosine"] == record.feature_cosine
    assert "| front end | B | fp32 ms | int8 ms | speed-up |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.parse_args([str(fp32)])  # bundles come in pairs


@pytest.mark.parametrize("bad", ["cut JPEG", "symlink loop", "empty file"])
def test_int8_calibration_folder_with_a_bad_image_is_refused_as_run_would_skip_it(run_cli, cnn_ckpt, photos,
                                                                                  tmp_path, bad):
    """--calibration reads a folder as `edgecap run` does: the grey lower half of a JPEG cut short
    used to calibrate the int8 ranges silently, and a symlink loop was "cannot decode frame"."""
    import os
    import shutil

    folder = tmp_path / "calib"
    shutil.copytree(photos, folder)
    if bad == "cut JPEG":
        data = cv2.imencode(".jpg", cv2.imread(str(folder / "frame00.png")))[1].tobytes()
        (folder / "frame02.jpg").write_bytes(data[: len(data) // 2])
        reason = "damaged JPEG: cut short (no end-of-image marker after its last scan)"
    elif bad == "symlink loop":
        os.symlink("frame02.jpg", folder / "frame02.jpg")
        reason = "cannot read (symbolic link loop)"
    else:
        (folder / "frame02.jpg").write_bytes(b"")
        reason = "empty (0 bytes)"
    code, _, err = run_cli("export", cnn_ckpt, "--engine", "onnx", "--precision", "int8", "--calibration", folder,
                           "--samples", 1, "--out", tmp_path / "b", "--quiet")
    _one_line(code, err, f"--calibration: {folder / 'frame02.jpg'}: {reason}")
    assert not (tmp_path / "b").exists()
