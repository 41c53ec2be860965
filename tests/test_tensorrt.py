"""TensorRT engines: the compatibility checks always run (the real parser where TensorRT or
TensorRT for RTX imports, edgecap's op list where neither does); engines build wherever a
TensorRT builder is installed (TensorRT for RTX builds without a GPU: every CI machine); running
one needs a supported GPU, and those tests skip saying so.

Every family's bundle builds real engines, at fp32 and fp16: with TensorRT for RTX (the trt-rtx
extra) on every CI machine, with full TensorRT where it is installed (a GPU machine). An engine's
bindings are checked against its manifest entry: at build time on the network TensorRT parsed
(the export refuses a mismatch), here again on that network, and on the deserialised engine
where a supported GPU can load it."""

import json
import shutil

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from edgecap.contract.manifest import ManifestError, ParityNotRun, load_manifest
from edgecap.errors import EdgecapError
from edgecap.export.compat import check_file, check_graph, polygraphy_inspect, require_compatible
from edgecap.models import list_models
from edgecap.runtime.tensorrt_dist import TENSORRT, TENSORRT_RTX, available, installed
from tests._export_util import export, save_tiny
from tests.tensorrt_helpers import engines_run_here, needs_builder, needs_gpu, parsed_bindings

no_gpu = pytest.mark.skipif(engines_run_here(), reason="this machine has a supported GPU: engines run here")


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
        dist = available()  # which parser judged: the real one wherever a TensorRT imports
        assert report.checked_by == (f"{dist.title} {__import__(dist.module).__version__}'s ONNX parser" if dist
                                     else "edgecap's list of TensorRT 10.0's ONNX ops (no TensorRT installed)")
    assert all(v.tensorrt_compatible and v.checked_by for v in m.checks.values())


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
    with pytest.raises(ManifestError, match=rf"graphs\[{len(data['graphs']) - 1}\]\.tensorrt: missing"):
        load_manifest(dst)
    engine["tensorrt"] = {"version": "0.0.1", "gpu": "Orin", "compute_capability": "8.7"}
    (dst / "manifest.json").write_text(json.dumps(data))
    info = load_manifest(dst).graph("visual", "tensorrt").tensorrt
    # an entry from before TensorRT for RTX: full TensorRT, for the GPU it was built on
    assert (info.distribution, info.compute_capabilities) == ("tensorrt", ["8.7"])
    engine["tensorrt"].update(distribution="tensorrt-rtx", compute_capabilities=["8.6", "8.9"])
    (dst / "manifest.json").write_text(json.dumps(data))
    info = load_manifest(dst).graph("visual", "tensorrt").tensorrt
    assert (info.distribution, info.compute_capabilities) == ("tensorrt-rtx", ["8.6", "8.9"])
    for bad, field in (({"distribution": "tensorrt-llm"}, r"distribution: 'tensorrt-llm', expected one of "
                                                          r"tensorrt, tensorrt-rtx"),
                       ({"compute_capabilities": ["sm86"]}, r"compute_capabilities: \['sm86'\], expected a list")):
        engine["tensorrt"].update(bad)
        (dst / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(ManifestError, match=rf"graphs\[{len(data['graphs']) - 1}\]\.tensorrt\." + field):
            load_manifest(dst)
        engine["tensorrt"].update(distribution="tensorrt-rtx", compute_capabilities=["8.6"])




needs_rtx = pytest.mark.skipif(not installed(TENSORRT_RTX), reason="tensorrt_rtx is not installed (pip install "
                               "'edgecap[trt-rtx]': TensorRT for RTX builds without a GPU)")
CNN = {"visual": {"kind": "cnn", "image_size": 16, "channels": [8, 24]}, "n_regions": 16}


@pytest.fixture(scope="module")
def cnn_ckpt(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny(tmp_path_factory.mktemp("ckpt") / "smart.pt", "smart", **CNN)


@pytest.fixture(scope="module")
def rtx_export(tmp_path_factory, cnn_ckpt):
    """`edgecap export CKPT --engine trt --tensorrt tensorrt-rtx`: (bundle, what it printed, checkpoint)."""
    import contextlib
    import io

    from edgecap.cli import main

    root = tmp_path_factory.mktemp("rtx")
    ckpt = shutil.copy(cnn_ckpt, root / "smart.pt")
    out, printed = root / "bundle", io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["export", str(ckpt), "--engine", "trt", "--tensorrt", "tensorrt-rtx", "--out", str(out),
                     "--batch", "2", "--beam", "2", "--samples", "2", "--quiet"])
    assert code == 0
    return out, printed.getvalue(), ckpt


def _one_line(code, err, *needles):
    lines = [line for line in err.strip().splitlines() if line]
    assert code == 1 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@needs_rtx
def test_trt_export_builds_tensorrt_for_rtx_engines_and_records_where_they_run(rtx_export):
    import tensorrt_rtx

    from edgecap.runtime.tensorrt_dist import compute_capabilities

    out, printed, _ = rtx_export
    m = load_manifest(out)
    engines = {g.role: g for g in m.graphs if g.engine == "tensorrt"}
    assert sorted(engines) == ["cache_update", "decoder_step", "encoder", "visual"]
    assert engines["decoder_step"].file == "decoder_step.b4.fp32.engine"  # 2 images x 2 beams
    assert engines["cache_update"].file == "cache_update.b4.fp32.engine"  # on the same rows
    targets = compute_capabilities(tensorrt_rtx)
    assert {"8.0", "8.6", "8.9", "12.0"} <= set(targets) and not {"7.5", "8.7", "9.0"} & set(targets)
    for g in engines.values():
        assert (g.tensorrt.distribution, g.tensorrt.version) == ("tensorrt-rtx", tensorrt_rtx.__version__)
        assert g.tensorrt.compute_capabilities == targets and g.source == f"{g.role}.onnx"
    # TensorRT for RTX has no timing cache: nothing is written beside the bundle
    assert sorted(p.name for p in out.parent.iterdir()) == ["bundle", "smart.pt"]
    assert "TensorRT for RTX" in m.checks["visual.onnx"].checked_by and m.versions.tensorrt_rtx == tensorrt_rtx.__version__
    written = json.loads((out / "manifest.json").read_text())  # the keys docs/bundle.md documents
    assert written["versions"]["tensorrt-rtx"] == tensorrt_rtx.__version__
    assert written["checks"]["visual.onnx"]["checked_by"] == m.checks["visual.onnx"].checked_by
    parity = m.parity["tensorrt"]
    if engines_run_here():
        assert parity.ran and parity.passed and "parity tensorrt fp32: beam" in printed
    else:
        assert isinstance(parity, ParityNotRun) and parity.precision == "fp32"
        assert "engines need a supported GPU, and this machine has none" in parity.reason
        assert written["parity"]["tensorrt"] == {"precision": "fp32", "ran": False, "reason": parity.reason}
        assert f"parity tensorrt fp32: not run here: {parity.reason}" in printed
    assert m.parity["onnxruntime"].passed


@needs_rtx
@no_gpu
def test_run_without_a_supported_gpu_is_one_line_and_onnxruntime_runs_the_bundle(rtx_export, run_cli):
    out = rtx_export[0]
    code, stdout, err = run_cli("run", out, "--source", "synth://tabletop", "--frames", 2, "--quiet")
    line = _one_line(code, err, "edgecap run: error: ", "was built with TensorRT for RTX",
                     "engines need a supported GPU, and this machine has none",
                     "run the bundle's ONNX graphs with onnxruntime instead (--engine onnxruntime)")
    assert stdout == "" and "Traceback" not in line
    code, stdout, err = run_cli("run", out, "--source", "synth://tabletop", "--frames", 2, "--engine", "onnxruntime")
    assert code == 0, err
    assert stdout.strip()  # the captions


@needs_rtx
def test_engines_on_a_gpu_tensorrt_for_rtx_does_not_build_for_say_what_to_rebuild_with(rtx_export, monkeypatch):
    from edgecap.runtime import engines
    from edgecap.runtime.session import Bundle

    out = rtx_export[0]
    monkeypatch.setattr(engines, "find_gpu", lambda: (("NVIDIA H100 80GB HBM3", "9.0"), ""))
    with pytest.raises(ManifestError) as err:
        Bundle.load(out)
    assert str(err.value).startswith("visual.b2.fp32.engine was built with TensorRT for RTX ")
    assert str(err.value).endswith(f"this machine has NVIDIA H100 80GB HBM3 (9.0); rebuild the engines here from the "
                                   f"ONNX graphs in the bundle: edgecap export {out} --engine trt --tensorrt tensorrt "
                                   f"--force")


@needs_builder
def test_engine_from_another_release_is_refused_with_a_rebuild_hint(bundle_dir, tmp_path):
    from edgecap.io import sha256_file
    from edgecap.runtime.session import Bundle

    dist = available()
    dst = tmp_path / "b"
    shutil.copytree(bundle_dir, dst)
    data = json.loads((dst / "manifest.json").read_text())
    engine = dict(data["graphs"][0], engine="tensorrt", file="visual.b2.fp16.engine", source="visual.onnx",
                  tensorrt={"version": "0.0.1", "gpu": "", "compute_capability": "8.6", "distribution": dist.name})
    (dst / engine["file"]).write_bytes(b"x")
    engine["sha256"] = sha256_file(dst / engine["file"])
    data["graphs"].append(engine)
    (dst / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=rf"visual.b2.fp16.engine was built with {dist.title} 0.0.1, this machine "
                                            rf"has .*; rebuild the engines here .*edgecap export .* --engine trt "
                                            rf"--tensorrt {dist.name} --force"):
        Bundle.load(dst, engine="tensorrt")


@pytest.mark.skipif(installed(TENSORRT), reason="tensorrt is installed here")
def test_an_engine_of_a_tensorrt_not_installed_names_its_extra(bundle_dir, tmp_path):
    from edgecap.io import sha256_file
    from edgecap.runtime.session import Bundle

    dst = tmp_path / "b"
    shutil.copytree(bundle_dir, dst)
    data = json.loads((dst / "manifest.json").read_text())
    engine = dict(data["graphs"][0], engine="tensorrt", file="visual.b2.fp16.engine", source="visual.onnx",
                  tensorrt={"version": "10.3.0", "gpu": "Orin", "compute_capability": "8.7"})
    (dst / engine["file"]).write_bytes(b"x")
    engine["sha256"] = sha256_file(dst / engine["file"])
    data["graphs"].append(engine)
    (dst / "manifest.json").write_text(json.dumps(data))
    assert Bundle.load(dst).engine == "onnxruntime"  # auto: the ONNX graphs, as before
    with pytest.raises(ManifestError, match=r"built with TensorRT 10.3.0, which is not installed here: pip install "
                                            r"\"edgecap\[trt\]\" \(that release\), or rebuild the engines here"):
        Bundle.load(dst, engine="tensorrt")


@needs_rtx
def test_options_tensorrt_for_rtx_cannot_honour_are_refused_in_one_line(rtx_export, run_cli, tmp_path):
    ckpt = rtx_export[2]
    out = tmp_path / "b"
    base = ("export", ckpt, "--engine", "trt", "--tensorrt", "tensorrt-rtx", "--out", out, "--quiet")
    code, _, err = run_cli(*base, "--precision", "int8", "--int8-mode", "calibrator")
    _one_line(code, err, "--int8-mode calibrator needs TensorRT 10 (TensorRT for RTX builds strongly typed networks "
                         "only; this machine has TensorRT for RTX 1.", "use --int8-mode qdq")
    code, _, err = run_cli(*base, "--timing-cache", tmp_path / "t.cache")
    _one_line(code, err, "TensorRT for RTX has no timing cache", "drop --timing-cache")
    code, _, err = run_cli("export", ckpt, "--engine", "trt", "--tensorrt", "tensorrt-llm", "--out", out)
    _one_line(code, err, "--tensorrt 'tensorrt-llm': expected one of auto, tensorrt, tensorrt-rtx")
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--tensorrt", "tensorrt-rtx", "--out", out)
    _one_line(code, err, "engine 'onnx' does not take --tensorrt")
    if not installed(TENSORRT):
        code, _, err = run_cli("export", ckpt, "--engine", "trt", "--tensorrt", "tensorrt", "--out", out)
        _one_line(code, err, "tensorrt is not installed", 'edgecap[trt]')
    assert not out.exists() and not (tmp_path / "t.cache").exists()


def _with_det(export_graph):
    """export_graph, with an unused Det (a determinant, which no TensorRT builds) added to the encoder."""
    from onnx import numpy_helper

    def patched(graph, path, *args, **kwargs):
        info = export_graph(graph, path, *args, **kwargs)
        if graph.role == "encoder":
            model = onnx.load(str(path))
            model.graph.initializer.append(numpy_helper.from_array(np.eye(2, dtype=np.float32), "det_in"))
            model.graph.node.append(helper.make_node("Det", ["det_in"], ["det_out"], name="det"))
            model.graph.output.append(helper.make_tensor_value_info("det_out", TensorProto.FLOAT, []))
            onnx.save(model, str(path))
        return info

    return patched


@needs_builder
def test_a_graph_tensorrt_cannot_build_fails_export_with_the_parsers_words(cnn_ckpt, run_cli, monkeypatch, tmp_path):
    import edgecap.export.onnx as onnx_export

    ckpt = cnn_ckpt
    monkeypatch.setattr(onnx_export, "export_graph", _with_det(onnx_export.export_graph))
    code, _, err = run_cli("export", ckpt, "--engine", "trt", "--out", tmp_path / "b", "--quiet", "--samples", 1)
    line = _one_line(code, err, "encoder.onnx is not TensorRT-compatible: ", "with name: det and operator: Det")
    assert "UNSUPPORTED_NODE" in line  # the parser's own words
    assert not (tmp_path / "b").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]
    # an ONNX bundle of the same graph records the parser's verdict in the manifest's checks
    result = export(ckpt, tmp_path / "onnx", samples=1)
    check = result.manifest.checks["encoder.onnx"]
    assert not check.tensorrt_compatible and "operator: Det" in check.problems[0]
    assert "ONNX parser" in check.checked_by and result.manifest.checks["visual.onnx"].tensorrt_compatible


def _matmul_relu(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32, dtype=np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [x], [y], initializer=[w])
    onnx.save(_model(graph.node, [x], [y], [w]), str(path))
    return path


class RecordingBar:
    """The calls a tqdm bar gets from the build's progress monitor."""

    def __init__(self):
        self.totals, self.updates, self.phases = [], 0, []

    def reset(self, total):
        self.totals.append(total)

    def update(self, n=1):
        self.updates += n

    def set_postfix_str(self, text, refresh=True):
        self.phases.append(text)

    def refresh(self):
        pass


@needs_builder
def test_a_build_reports_tensorrts_progress_and_checks_the_bindings(tmp_path):
    from edgecap.contract.manifest import GraphEntry
    from edgecap.export.tensorrt import build_engine

    dist = available()
    src = _matmul_relu(tmp_path / "mm.onnx")
    entry = GraphEntry.of_file("encoder", "mm.onnx", tmp_path, "onnxruntime", "fp32",
                               [{"name": "x", "shape": [2, 8], "dtype": "float32"}],
                               [{"name": "y", "shape": [2, 4], "dtype": "float32"}])
    bar = RecordingBar()
    info = build_engine(src, tmp_path / "mm.engine", "fp32", dist, source_entry=entry, bar=bar)
    assert (tmp_path / "mm.engine").stat().st_size > 1000 and info.distribution == dist.name
    assert bar.totals and bar.updates == bar.totals[0] > 0  # TensorRT's top phase, step by step
    assert "Building engine" in bar.phases
    entry.outputs[0].shape = [2, 5]
    with pytest.raises(ManifestError, match=r"'y' is the parsed network's output, float32 \[2, 4\]; manifest.json "
                                            r"says output float32 \[2, 5\]"):
        build_engine(src, tmp_path / "mm2.engine", "fp32", dist, source_entry=entry, bar=bar)
    assert not (tmp_path / "mm2.engine").exists()


@needs_builder
def test_trt_int8_builds_from_qdq_graphs_with_float_biases(cnn_ckpt, tmp_path):
    """TensorRT's parser refuses an int32 DequantizeLinear ("input has type Int32 but must have
    type FP8, FP4, Int4, Int8, or UInt8"), so TensorRT's QDQ graphs keep their biases float."""
    result = export(cnn_ckpt, tmp_path / "int8", engine="trt", precision="int8", samples=1)
    m = result.manifest
    # the cache_update graph only moves the fp32 cache: fp32 at every precision, its engine too
    assert {(g.role == "cache_update", g.precision) for g in m.graphs} == {(False, "int8"), (True, "fp32")}
    assert all(c.tensorrt_compatible for c in m.checks.values())
    assert {g.tensorrt.int8_mode for g in m.graphs if g.engine == "tensorrt" and g.role != "cache_update"} == {"qdq"}
    step = onnx.load(str(result.path / "decoder_step.onnx"))
    constants = {i.name: i.data_type for i in step.graph.initializer}
    dequantized = [constants.get(n.input[0]) for n in step.graph.node if n.op_type == "DequantizeLinear"]
    assert dequantized and TensorProto.INT32 not in dequantized and TensorProto.INT8 in dequantized


@needs_builder
def test_rebuilding_a_bundles_engines_from_its_onnx_graphs(bundle_dir, run_cli, tmp_path):
    out = tmp_path / "rebuilt"
    code, stdout, err = run_cli("export", bundle_dir, "--engine", "trt", "--out", out, "--quiet")
    assert code == 0, err
    m = load_manifest(out)
    assert sorted(g.file for g in m.graphs if g.engine == "tensorrt") == [
        "cache_update.b4.fp32.engine", "decoder_step.b4.fp32.engine", "encoder.b2.fp32.engine",
        "visual.b2.fp32.engine"]
    report = m.parity["tensorrt"]
    assert report.passed if engines_run_here() else isinstance(report, ParityNotRun)
    assert load_manifest(bundle_dir).graph("encoder", "tensorrt") is None  # the source bundle is untouched


@needs_gpu
def test_trt_engines_caption_on_a_supported_gpu(rtx_export):
    from edgecap.runtime.session import Bundle

    b = Bundle.load(rtx_export[0])
    assert b.engine == "tensorrt" and load_manifest(rtx_export[0]).parity["tensorrt"].passed
    images = np.zeros((b.batch_size, 3, 16, 16), np.float32)
    assert len(b.captions(b.decode(b.encode(*b.visual(images))))) == b.batch_size


@needs_gpu
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


def test_tensorrt_for_rtx_verdict_and_runtime_cache_without_a_gpu(tmp_path, capsys):
    """What the runner does with TensorRT for RTX's own calls, over stand-ins of them (they need a
    GPU): an invalid plan is one line with the reasons in words; the runtime cache is read from
    beside the bundle, a cache for another machine is said once, and a folder that cannot be
    written is said once, never fatal."""
    import types

    from edgecap.runtime import engines

    flags = types.SimpleNamespace(VERSION_MISMATCH=1, UNSUPPORTED_CC=2, OLD_CUDA_DRIVER=4, OLD_CUDA_RUNTIME=8,
                                  INSUFFICIENT_GPU_MEMORY=16, MALFORMED_ENGINE=32, CUDA_ERROR=64)
    trt = types.SimpleNamespace(__version__="1.7.1.116", EngineInvalidityDiagnostics=flags,
                                EngineValidity=types.SimpleNamespace(VALID=0, INVALID=2))
    runtime = types.SimpleNamespace(get_engine_validity=lambda plan: (2, 2 | 4))
    with pytest.raises(ManifestError, match=r"^TensorRT for RTX 1.7.1.116 cannot run e.engine here: it was not built "
                                            r"for this GPU's compute capability; the CUDA driver is too old; rebuild"):
        engines.check_engine_validity(trt, runtime, b"plan", tmp_path / "e.engine", tmp_path / "bundle")
    engines.check_engine_validity(trt, types.SimpleNamespace(get_engine_validity=lambda plan: (0, 0)), b"plan",
                                  tmp_path / "e.engine", tmp_path / "bundle")

    class Cache:
        def __init__(self):
            self.loaded = None

        def deserialize(self, blob):
            self.loaded = blob
            return blob == b"ours"

        def serialize(self):
            return b"compiled kernels"

    class Config:
        def create_runtime_cache(self):
            self.cache = Cache()
            return self.cache

        def set_runtime_cache(self, cache):
            self.set = cache

    engine = types.SimpleNamespace(create_runtime_config=Config)
    path = engines.runtime_cache_path(tmp_path / "bundle", "visual.b1.fp16.engine")
    assert path == tmp_path / "bundle.runtime-cache" / "visual.b1.fp16.engine.cache"
    config, cache = engines.open_runtime_cache(engine, path)
    assert config.set is cache and cache.loaded is None  # no file yet: a fresh cache
    path.parent.mkdir()
    path.write_bytes(b"another GPU's")
    engines.open_runtime_cache(engine, path)
    assert "written for another GPU, driver or TensorRT for RTX" in capsys.readouterr().err

    graph = object.__new__(engines.TrtGraph)  # the runner's save, without a GPU to open one
    graph.runtime_cache, graph.runtime_cache_file = cache, path
    graph.save_runtime_cache()
    assert path.read_bytes() == b"compiled kernels" and graph.runtime_cache is None  # once
    graph.runtime_cache, graph.runtime_cache_file = Cache(), tmp_path / "no" / "such" / "x.cache"
    graph.save_runtime_cache()
    assert "cannot keep TensorRT for RTX's runtime cache" in capsys.readouterr().err


def test_tensorrt_for_rtx_captures_its_own_cuda_graphs_without_a_gpu():
    """With CUDA graphs, a TensorRT for RTX binding gets an execution context whose runtime config
    asks TensorRT for RTX to capture and replay it (a stream capture from outside fails on its
    engines), sharing the engine's runtime cache; full TensorRT's bindings are stream-captured by
    the runner. Over stand-ins of the engine (they need a GPU to open)."""
    import types

    from edgecap.runtime import engines

    class Config:
        def set_runtime_cache(self, cache):
            self.cache = cache

    class Engine:
        def __init__(self):
            self.contexts = []

        def create_runtime_config(self):
            return Config()

        def create_execution_context(self, *config):
            context = types.SimpleNamespace(config=config[0] if config else None, set_tensor_address=lambda n, p: True)
            self.contexts.append(context)
            return context

    strategy = types.SimpleNamespace(DISABLED=0, WHOLE_GRAPH_CAPTURE=1)
    trt = types.SimpleNamespace(CudaGraphStrategy=strategy)
    engine, kernels = Engine(), object()
    captured = engines.rtx_graph_capture(trt, engine, kernels)
    assert captured.cuda_graph_strategy == strategy.WHOLE_GRAPH_CAPTURE and captured.cache is kernels

    graph = object.__new__(engines.TrtGraph)
    graph.engine, graph.entry, graph.cuda_graph = engine, types.SimpleNamespace(file="decoder_step.b4.fp32.engine"), True
    graph.rtx, graph.runtime_config, graph.captured_config = True, Config(), captured
    plain_run = engines._CapturedRun(graph, {"token": 1}, capture=False)
    captured_run = engines._CapturedRun(graph, {"token": 2}, capture=True)
    assert plain_run.context.config is graph.runtime_config and not plain_run.capture
    assert captured_run.context.config is captured and not captured_run.capture  # TensorRT for RTX captures it
    graph.rtx = False  # full TensorRT: a plain context, captured by the runner on its stream
    full_run = engines._CapturedRun(graph, {"token": 3}, capture=True)
    assert full_run.context.config is None and full_run.capture


# -- every family's bundle builds real engines, fp32 and fp16 --------------------------------------
FAMILIES = list_models()
PRECISIONS = ("fp32", "fp16")  # every family exports an fp16 graph (quantize.convert_fp16)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-families")
    made = {}

    def make(name, precision):
        if (name, precision) not in made:
            ckpt = root / f"{name}.pt"
            if not ckpt.exists():
                save_tiny(ckpt, name)
            made[name, precision] = export(ckpt, root / f"{name}-{precision}", engine="trt", precision=precision,
                                           samples=1).path
        return made[name, precision]

    return make


@needs_builder
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_builds_engines_whose_bindings_are_the_manifests(bundles, name, precision):
    from edgecap.runtime.tensorrt_dist import available

    path = bundles(name, precision)
    m = load_manifest(path)
    dist = available()
    graphs = {g.role: g for g in m.graphs if g.engine == "onnxruntime"}
    engines = {g.role: g for g in m.graphs if g.engine == "tensorrt"}
    assert set(engines) == set(graphs) and "cache_update" in engines, (name, precision)
    for role, engine in engines.items():
        info = engine.tensorrt
        # the cache_update graph only moves the fp32 cache: an fp32 engine at every precision
        assert engine.precision == ("fp32" if role == "cache_update" else precision)
        assert engine.source == graphs[role].file and engine.precision == graphs[role].precision
        assert info.distribution == dist.name and info.version and info.compute_capabilities
        assert (path / engine.file).stat().st_size > 1000  # a serialised plan, not a stand-in
        # the bindings TensorRT built the engine with are the tensors the manifest lists
        assert parsed_bindings(path / engine.source, dist) == {
            **{t.name: ("input", t.dtype, t.shape) for t in engine.inputs},
            **{t.name: ("output", t.dtype, t.shape) for t in engine.outputs}}
    assert all(c.tensorrt_compatible and "ONNX parser" in c.checked_by for c in m.checks.values()), m.checks
    parity = m.parity["tensorrt"]
    assert parity.precision == precision
    if engines_run_here(dist):
        assert parity.ran and parity.passed
    else:
        assert not parity.ran and "engines need a supported GPU" in parity.reason


@needs_gpu
def test_every_familys_engines_load_and_caption_on_a_supported_gpu(bundles):
    """On a GPU TensorRT for RTX runs (Ampere, Ada, Blackwell), or with full TensorRT: the
    deserialised engines' bindings match the manifest (checked as they load), and they caption."""
    from edgecap.export.rebuild import random_model_inputs
    from edgecap.runtime.session import Bundle

    for name in FAMILIES:
        b = Bundle.load(bundles(name, "fp32"), engine="tensorrt")
        assert b.engine == "tensorrt"
        (feats, mask), extra = random_model_inputs(b.manifest)
        assert len(b.captions(b.decode(b.encode(feats, mask, *extra)))) == b.batch_size, name
