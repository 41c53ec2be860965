"""The TensorRT API edgecap uses: the version gates that keep TensorRT 10.x and 11.x apart and
the compatibility checks that run without a GPU; and the API check (benchmarks/_trt_api.py, a
development tool): the TensorRT / TensorRT for RTX / cuda-python calls edgecap makes, read from
its source, checked against the installed modules where they exist (TensorRT for RTX is, from
the trt-rtx extra) and against downloaded release bindings where cached
(benchmarks/trt_api_check.py)."""

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgecap.contract.manifest import ManifestError
from edgecap.errors import EdgecapError
from edgecap.export.compat import check_graph
from tests.conftest import fake_tensorrt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _trt_api import api_uses, missing_api, missing_cuda_api  # noqa: E402


def test_an_unsupported_tensorrt_is_one_line(monkeypatch):
    from edgecap.runtime.engines import tensorrt_module

    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("8.6.1"))
    with pytest.raises(EdgecapError) as err:
        tensorrt_module("--engine trt")
    assert str(err.value) == ('TensorRT 8.6.1 is not supported (--engine trt): edgecap builds and runs engines '
                              'with TensorRT 10.x or 11.x (pip install "tensorrt>=10,<12")')


def test_export_refuses_an_unsupported_tensorrt_and_the_calibrator_on_11(run_cli, monkeypatch, tmp_path):
    from tests._export_util import save_tiny

    ckpt = save_tiny(tmp_path / "m.pt", "smart")
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("12.0.0"))
    code, _, err = run_cli("export", ckpt, "--engine", "trt", "--out", tmp_path / "b")
    assert code == 1 and "TensorRT 12.0.0 is not supported" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("11.4.0.106"))
    code, _, err = run_cli("export", ckpt, "--engine", "trt", "--precision", "int8", "--int8-mode", "calibrator",
                           "--out", tmp_path / "b")
    assert code == 1 and "--int8-mode calibrator needs TensorRT 10" in err and "use --int8-mode qdq" in err
    assert not (tmp_path / "b").exists()


def test_a_graph_without_the_precision_asked_for_is_refused():
    from edgecap.export.tensorrt import require_graph_precision

    fp32 = {"fp16": False, "int8": False, "fp32_norms": 0}
    with pytest.raises(EdgecapError, match="step.onnx computes in fp32, not fp16: TensorRT builds strongly typed"):
        require_graph_precision(fp32, "fp16", Path("step.onnx"))
    require_graph_precision({**fp32, "fp16": True}, "fp16", Path("step.onnx"))
    require_graph_precision(fp32, "fp32", Path("step.onnx"))


def test_an_engine_whose_tensors_differ_from_the_manifest_is_refused():
    from edgecap.contract.manifest import GraphEntry
    from edgecap.runtime.engines import check_engine_io

    entry = GraphEntry.from_dict({"role": "encoder", "file": "encoder.b1.fp16.engine", "sha256": "0" * 64,
                                  "engine": "tensorrt", "precision": "fp16",
                                  "tensorrt": {"version": "10.3.0", "gpu": "Orin", "compute_capability": "8.7"},
                                  "inputs": [{"name": "feats", "shape": [1, 6, 24], "dtype": "float32"}],
                                  "outputs": [{"name": "cross", "shape": [1, 6, 32], "dtype": "float32"}]},
                                 "manifest.json: graphs[0]")
    dtype = types.SimpleNamespace
    trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="in", OUTPUT="out"))

    class Engine:  # the ICudaEngine calls the runner makes, over a table of tensors
        def __init__(self, tensors):
            self.tensors = tensors
            self.num_io_tensors = len(tensors)

        def get_tensor_name(self, i):
            return list(self.tensors)[i]

        def get_tensor_mode(self, name):
            return self.tensors[name][0]

        def get_tensor_dtype(self, name):
            return dtype(name=self.tensors[name][1])

        def get_tensor_shape(self, name):
            return self.tensors[name][2]

    good = {"feats": ("in", "FLOAT", (1, 6, 24)), "cross": ("out", "FLOAT", (1, 6, 32))}
    check_engine_io(trt, Engine(good), entry, Path("b/encoder.b1.fp16.engine"))
    with pytest.raises(ManifestError, match=r"'cross' is the engine's output, float16 \[1, 6, 32\]; manifest.json "
                                            r"says output float32 \[1, 6, 32\]"):
        check_engine_io(trt, Engine({**good, "cross": ("out", "HALF", (1, 6, 32))}), entry, Path("e"))
    with pytest.raises(ManifestError, match="the engine has no input 'feats'"):
        check_engine_io(trt, Engine({"cross": good["cross"]}), entry, Path("e"))


def _qdq_model(zero_type, zero_value):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             helper.make_tensor("z", zero_type, [], [zero_value])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_only_symmetric_int8_qdq_is_tensorrt_compatible():
    assert check_graph(_qdq_model(TensorProto.INT8, 0)).ok
    problems = " | ".join(check_graph(_qdq_model(TensorProto.UINT8, 128)).problems)
    assert "QuantizeLinear 'q': zero point is UINT8, TensorRT quantizes to INT8 only" in problems
    problems = " | ".join(check_graph(_qdq_model(TensorProto.INT8, 3)).problems)
    assert "DequantizeLinear 'dq': non-zero zero point (asymmetric quantization" in problems


def test_onnxruntime_default_static_qdq_and_dynamic_int8_are_refused(tmp_path):
    """Graphs made by onnxruntime's own quantizers with their defaults: static QDQ quantizes
    activations asymmetrically, dynamic writes integer ops; TensorRT takes neither."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        quantize_dynamic,
        quantize_static,
    )

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y], initializer=[w])
    src = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": np.abs(rng.standard_normal((2, 8))).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(str(src), str(tmp_path / "static.onnx"), Reader(), quant_format=QuantFormat.QDQ)
    report = check_graph(onnx.load(str(tmp_path / "static.onnx")))
    assert any("non-zero zero point (asymmetric quantization" in p for p in report.problems), report.problems
    quantize_dynamic(str(src), str(tmp_path / "dynamic.onnx"))
    report = check_graph(onnx.load(str(tmp_path / "dynamic.onnx")))
    assert any(p.startswith("op MatMulInteger is not supported by the TensorRT ONNX parser (onnxruntime's dynamic "
                            "int8; TensorRT builds int8 from QDQ graphs") for p in report.problems), report.problems


def test_an_opset_tensorrt_10_cannot_read_is_reported():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    assert "opset 21: TensorRT 10.0's ONNX parser reads opsets 9-20" in check_graph(model).problems


def test_fp16_graphs_keep_layer_norm_in_fp32(tmp_path):
    import onnxruntime as ort

    from edgecap.export.quantize import convert_fp16

    d = 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, d])
    inits = [numpy_helper.from_array(np.eye(d, dtype=np.float32) * 300, "w"),
             numpy_helper.from_array(np.ones(d, np.float32), "g"), numpy_helper.from_array(np.zeros(d, np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=inits)
    path = tmp_path / "ln.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    assert convert_fp16(path, path) == "fp16"
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)  # topologically sorted, types agree
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types_ = {v.name: v.type.tensor_type.elem_type for v in list(model.graph.value_info) + list(model.graph.output)}
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    assert types_[ln.input[0]] == TensorProto.FLOAT and types_[ln.output[0]] == TensorProto.FLOAT
    assert TensorProto.FLOAT16 in types_.values() and check_graph(model).ok
    # a variance of 300^2-scale values: fp16 would overflow, the fp32 norm gives unit-variance rows
    feed = np.tile(np.linspace(-1, 1, d, dtype=np.float32), (2, 1))
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": feed})[0]
    assert np.isfinite(out).all() and np.allclose(out.std(axis=1), 1.0, atol=1e-2)


def test_rebuilt_engines_keep_their_graphs_precision():
    from edgecap.contract.manifest import GraphEntry, TensorRTInfo
    from edgecap.export.rebuild import rebuilt_precision

    trt = TensorRTInfo("10.0", "gpu", "8.7")
    graphs = [GraphEntry("encoder", "encoder.onnx", "0" * 64, "onnxruntime", "fp16", [], []),
              GraphEntry("encoder", "encoder.b1.fp16.engine", "0" * 64, "tensorrt", "fp16", [], [], tensorrt=trt)]
    assert rebuilt_precision(Path("b"), graphs, "fp32") == "fp16"  # --precision left at its default
    assert rebuilt_precision(Path("b"), graphs, "fp16") == "fp16"
    with pytest.raises(EdgecapError, match="the ONNX graphs in b are fp16: rebuilt engines keep their graphs' "
                                           "precision; for int8 engines export the checkpoint with --engine trt"):
        rebuilt_precision(Path("b"), graphs, "int8")
    # an fp16 engine over an fp32 graph (TensorRT 10's weakly typed FP16 flag) cannot be rebuilt as fp16
    graphs[0].precision = "fp32"
    with pytest.raises(EdgecapError, match=r"engine encoder.b1.fp16.engine is fp16 but its ONNX graph is fp32 .*"
                                           r"export the checkpoint again with --engine trt --precision fp16"):
        rebuilt_precision(Path("b"), graphs, "fp32")


def test_a_graph_shape_inference_rejects_is_a_problem_not_a_crash():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    wrong = helper.make_tensor_value_info("h", TensorProto.FLOAT16, [2])  # Relu of float is float
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              value_info=[wrong])
    report = check_graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))
    assert not report.ok and report.problems[0].startswith("ONNX shape inference fails: ")
    assert "Inferred elem type differs" in report.problems[0]


# -- the API check ---------------------------------------------------------------------------------
HAS_TRT = importlib.util.find_spec("tensorrt") is not None
HAS_RTX = importlib.util.find_spec("tensorrt_rtx") is not None
HAS_CUDA = importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


def _uses():
    return {u.name: u for u in api_uses()}


def test_the_uses_are_read_from_the_tensorrt_code():
    uses = _uses()
    run = uses["IExecutionContext.execute_async_v3"]
    assert run.called and run.positional == 1 and run.apis == ("tensorrt-10", "tensorrt-11", "tensorrt-rtx-1")
    assert uses["IBuilderConfig.set_timing_cache"].keywords == ("ignore_mismatch",)
    assert uses["IBuilderConfig.set_timing_cache"].apis == ("tensorrt-10", "tensorrt-11")  # RTX: a no-op
    assert not uses["ICudaEngine.num_io_tensors"].called  # a property
    # implicit INT8 exists on TensorRT 10 only, and the calibrator must override its base's methods
    assert uses["tensorrt.BuilderFlag.INT8"].apis == ("tensorrt-10",)
    assert uses["IInt8EntropyCalibrator2.get_batch"].override and uses["IInt8EntropyCalibrator2.get_batch"].apis == ("tensorrt-10",)
    # TensorRT for RTX's own calls: compute capabilities at build time, its verdict and runtime cache at run time
    assert uses["IBuilderConfig.set_compute_capability"].apis == ("tensorrt-rtx-1",)
    assert uses["Runtime.get_engine_validity"].apis == ("tensorrt-rtx-1",)
    assert uses["IRuntimeConfig.create_runtime_cache"].holder == "runtime_cache"
    assert uses["IProgressMonitor.step_complete"].override
    assert uses["cudart.cudaMemcpyAsync"].positional == 5


def test_missing_api_names_the_use_and_what_is_wrong():
    class ExecutionContext:
        def execute_async_v3(self, stream_handle):
            """execute_async_v3(self: tensorrt.IExecutionContext, stream_handle: int) -> bool"""

        def set_tensor_address(self, name):
            """set_tensor_address(self: tensorrt.IExecutionContext, name: str) -> bool"""

    problems = missing_api(fake_tensorrt("11.4.0", IExecutionContext=ExecutionContext))
    text = "\n".join(problems)
    assert "IExecutionContext.execute_async_v3" not in text  # present, one argument
    assert "IExecutionContext.set_tensor_address (engines.py:" in text and "documented as (name)" in text
    assert "tensorrt.Builder (tensorrt.py:" in text and ": missing" in text
    assert "IInt8EntropyCalibrator2" not in text  # 10 only: not asked of an 11
    assert any("IInt8EntropyCalibrator2" in p for p in missing_api(fake_tensorrt("10.3.0")))


@pytest.mark.skipif(not (HAS_TRT or HAS_RTX), reason="no TensorRT installed (pip install 'edgecap[trt-rtx]')")
def test_installed_tensorrts_have_every_name_edgecap_uses():
    """Each installed distribution (TensorRT for RTX from the trt-rtx extra everywhere; full
    TensorRT on a GPU machine) has every name its release is asked for."""
    for module in ("tensorrt", "tensorrt_rtx"):
        if importlib.util.find_spec(module) is not None:
            assert missing_api(importlib.import_module(module)) == [], module
    if HAS_RTX:  # and what only full TensorRT has is not asked of TensorRT for RTX
        import tensorrt_rtx

        assert not hasattr(tensorrt_rtx.BuilderFlag, "INT8") and not hasattr(tensorrt_rtx, "IInt8EntropyCalibrator2")


@pytest.mark.skipif(not HAS_CUDA, reason="cuda-python is not installed (pip install 'edgecap[trt]')")
def test_installed_cuda_python_has_every_call_the_engine_runner_makes():
    from cuda.bindings import runtime

    assert missing_cuda_api(runtime) == []


CACHED = sorted((Path.home() / ".cache" / "edgecap" / "bindings").glob("tensorrt-cu12-bindings-*/*.whl"))


@pytest.mark.skipif(not CACHED or sys.platform != "linux", reason="no TensorRT bindings downloaded: "
                    "python benchmarks/trt_api_check.py --download VERSION")
def test_downloaded_tensorrt_releases_have_every_name_edgecap_uses(capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import trt_api_check
    finally:
        sys.path.pop(0)
    code = trt_api_check.main([str(p) for p in CACHED])
    table = capsys.readouterr().out
    assert code == 0, table
    assert table.count("| tensorrt |") == len(CACHED) and "could not import" not in table


@pytest.mark.skipif(not CACHED or sys.platform != "linux", reason="no TensorRT bindings downloaded: "
                    "python benchmarks/trt_api_check.py --download VERSION")
def test_the_offline_check_finds_what_a_release_lacks(capsys, tmp_path):
    """TensorRT code written for 10 (the FP16 flag, a builder config kept under a name the
    check does not follow) fails against an 11 release, naming each use."""
    source = tmp_path / "legacy.py"
    source.write_text("def build(trt, builder):\n"
                      "    cfg = builder.create_builder_config()\n"
                      "    config = cfg\n"
                      "    config.set_flag(trt.BuilderFlag.FP16)\n"
                      "    return builder.platform_has_fast_fp16\n")
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import trt_api_check
    finally:
        sys.path.pop(0)
    eleven = [p for p in CACHED if "-11." in p.name]
    if not eleven:
        pytest.skip("no TensorRT 11 bindings downloaded")
    code = trt_api_check.main([str(eleven[-1]), "--sources", str(source)])
    table = capsys.readouterr().out
    assert code == 1
    assert "tensorrt.BuilderFlag.FP16 (legacy.py:4): missing" in table
    assert "Builder.platform_has_fast_fp16 (legacy.py:5): missing" in table
    assert "Builder.create_builder_config (legacy.py:2): returns IBuilderConfig, stored in 'cfg'" in table
