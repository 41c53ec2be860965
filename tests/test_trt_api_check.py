"""The TensorRT / TensorRT for RTX / cuda-python API edgecap calls (benchmarks/_trt_api.py, a
development tool): read from its source, checked against the installed modules where they exist
(TensorRT for RTX is, from the trt-rtx extra) and against downloaded release bindings where
cached (benchmarks/trt_api_check.py)."""

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _trt_api import api_uses, missing_api, missing_cuda_api  # noqa: E402

from tests.conftest import fake_tensorrt  # noqa: E402

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
