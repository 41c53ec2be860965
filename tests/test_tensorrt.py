"""TensorRT: the GPU-free compatibility checks always run; engine builds need `tensorrt`."""

import importlib.util
import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from edgecap.contract.manifest import ManifestError, load_manifest
from edgecap.errors import EdgecapError
from edgecap.export.compat import check_file, check_graph, polygraphy_inspect, require_compatible
from tests._export_util import export, save_tiny

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
needs_trt = pytest.mark.skipif(not HAS_TRT, reason="tensorrt is not installed (pip install 'edgecap[trt]' on a GPU machine)")


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("trt")
    ckpt = save_tiny(root / "m2.pt", "m2", visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]}, n_regions=16)
    return export(ckpt, root / "bundle").path


def test_exported_graphs_pass_the_compat_checks_and_polygraphy(bundle_dir):
    m = load_manifest(bundle_dir)
    ranges = {"token": (0, len(m.vocab.itos) - 1), "step": (0, m.max_len - 1)}
    for g in m.graphs:
        report = check_file(bundle_dir / g.file, ranges)
        assert report.ok, (g.file, report.problems)
        assert report.polygraphy["ran"] and report.polygraphy["dynamic_inputs"] == []
        assert {n: i["shape"] for n, i in report.polygraphy["inputs"].items()} == {t.name: t.shape for t in g.inputs}
        assert report.polygraphy["outputs"] == {t.name: t.shape for t in g.outputs}
    assert all(v["tensorrt_compatible"] for v in m.checks.values())


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_dynamic_shapes_are_reported():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    report = check_graph(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]))
    assert not report.ok
    assert any("input 'x' has a non-static shape ['batch', 4]" in p for p in report.problems)


def test_control_flow_data_dependent_ops_and_doubles_are_reported():
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3])
    nz = helper.make_tensor_value_info("nz", TensorProto.INT64, [2, 6])
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.DOUBLE, [2, 3])])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("If", ["cond"], ["out"], then_branch=then, else_branch=then),
        helper.make_node("Det", ["x2"], ["det"]),
    ]
    x2 = helper.make_tensor("x2", TensorProto.FLOAT, [2, 2], [1.0, 0.0, 0.0, 1.0])
    out = helper.make_tensor_value_info("out", TensorProto.DOUBLE, [2, 3])
    det = helper.make_tensor_value_info("det", TensorProto.FLOAT, [])
    report = check_graph(_model(nodes, [x], [nz, out, det], [cond, x2]))
    text = " | ".join(report.problems)
    assert "control flow op If" in text
    assert "op NonZero has a data-dependent output shape" in text
    assert "op Det is not supported by the TensorRT ONNX parser" in text
    assert "input 'x' has element type 11" in text
    with pytest.raises(EdgecapError, match="is not TensorRT-compatible: control flow op If"):
        require_compatible([report])


def test_polygraphy_runs_a_graph_with_onnxruntime(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    path = tmp_path / "relu.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [x], [y]), str(path))
    info = polygraphy_inspect(path)
    assert info["ran"] and info["inputs"]["x"]["shape"] == [2, 3] and info["outputs"] == {"y": [2, 3]}


def test_engine_entry_must_say_what_it_was_built_for(bundle_dir, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(bundle_dir, dst)
    data = json.loads((dst / "manifest.json").read_text())
    engine = dict(data["graphs"][0], engine="tensorrt", file="visual.b2.fp16.engine", source="visual.onnx")
    (dst / engine["file"]).write_bytes((dst / "visual.onnx").read_bytes())
    data["graphs"].append(engine)
    (dst / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"graphs\[3\]\.tensorrt: missing"):
        load_manifest(dst)
    engine["tensorrt"] = {"version": "0.0.1", "gpu": "Orin", "compute_capability": "8.7"}
    (dst / "manifest.json").write_text(json.dumps(data))
    assert load_manifest(dst).graph("visual", "tensorrt").tensorrt.compute_capability == "8.7"


@needs_trt
def test_engine_from_another_tensorrt_version_is_refused_with_a_rebuild_hint(bundle_dir, tmp_path):
    from edgecap.runtime.session import Bundle

    dst = tmp_path / "b"
    shutil.copytree(bundle_dir, dst)
    data = json.loads((dst / "manifest.json").read_text())
    engine = dict(data["graphs"][0], engine="tensorrt", file="visual.b2.fp16.engine", source="visual.onnx",
                  tensorrt={"version": "0.0.1", "gpu": "Orin", "compute_capability": "8.7"})
    (dst / engine["file"]).write_bytes(b"x")
    from edgecap.io import sha256_file

    engine["sha256"] = sha256_file(dst / engine["file"])
    data["graphs"].append(engine)
    (dst / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"built with TensorRT 0.0.1.*edgecap export .* --engine trt --force"):
        Bundle.load(dst, engine="tensorrt")


@needs_trt
def test_trt_export_builds_engines_and_passes_parity(tmp_path):
    from edgecap.runtime.session import Bundle

    ckpt = save_tiny(tmp_path / "smart.pt", "smart")
    cache = tmp_path / "timing.cache"
    result = export(ckpt, tmp_path / "trt", engine="trt", precision="fp32", timing_cache=str(cache))
    m = result.manifest
    engines = [g for g in m.graphs if g.engine == "tensorrt"]
    assert sorted(g.role for g in engines) == ["decoder_step", "encoder"]
    assert all(g.tensorrt.version and g.tensorrt.compute_capability and g.source.endswith(".onnx") for g in engines)
    assert m.parity["tensorrt"].passed and cache.is_file()
    b = Bundle.load(result.path)
    assert b.engine == "tensorrt"
    feats = np.zeros((b.batch_size, 6, 24), np.float32)
    assert len(b.captions(b.decode(b.encode(feats, np.ones((b.batch_size, 6), bool))))) == b.batch_size


@needs_trt
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_trt_reduced_precision_reports_parity(tmp_path, precision):
    ckpt = save_tiny(tmp_path / "smart.pt", "smart")
    result = export(ckpt, tmp_path / "trt", engine="trt", precision=precision)
    assert result.parity["tensorrt"].precision == precision


@needs_trt
def test_trt_fp16_builds_a_vit_visual_graph_with_fp32_layer_norms(tmp_path):
    """A real ViT-L/14 front end (56 px input: a 4 x 4 grid) through the fp16 builder: every
    LayerNorm stays fp32 and the features keep close to PyTorch's."""
    from edgecap.models.frontends import frontend_overrides

    ckpt = save_tiny(tmp_path / "vit.pt", "smart", **frontend_overrides("ViT-L-14", image_size=56))
    result = export(ckpt, tmp_path / "trt", engine="trt", precision="fp16", workspace=4096)
    visual = result.manifest.graph("visual", "tensorrt")
    assert visual.tensorrt.fp32_layers == 2 * 24 + 2  # ln_1 / ln_2 per block, ln_pre, ln_post
    report = result.parity["tensorrt"]
    assert report.max_abs_delta["visual"] < 0.05 * max(1.0, report.feature_scale)
    assert report.visual_beam_identical is not None
