"""What the TensorRT tests share: which TensorRT builds here, and whether engines can run.

TensorRT for RTX (`tensorrt_rtx`, the trt-rtx extra that `make test` installs) builds engines on
any machine, GPU or not; running one needs a GPU of a compute capability it was built for
(TensorRT for RTX: Ampere, Ada, Blackwell; full TensorRT: the GPU it builds on), which no CI
machine here has: those tests skip saying so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgecap.runtime.tensorrt_dist import (
    TENSORRT_RTX,
    Distribution,
    available,
    compute_capabilities,
    load,
)


def gpu_problem(dist: Distribution | None = None) -> str:
    """"" when engines of `dist` (default: the one --tensorrt auto takes) can run here, else why not."""
    from edgecap.runtime.engines import find_gpu

    dist = dist or available()
    if dist is None:
        return "no TensorRT installed"
    gpu, why = find_gpu()
    if gpu is None:
        return f"no GPU ({why})"
    if dist is TENSORRT_RTX and gpu[1] not in compute_capabilities(load(dist, "tests")):
        return f"{gpu[0]} (compute capability {gpu[1]}) is not one TensorRT for RTX builds for"
    return ""


def engines_run_here(dist: Distribution | None = None) -> bool:
    return not gpu_problem(dist)


needs_builder = pytest.mark.skipif(available() is None, reason="no TensorRT builder installed "
                                   "(pip install 'edgecap[trt-rtx]': TensorRT for RTX builds without a GPU)")
needs_gpu = pytest.mark.skipif(not engines_run_here(), reason=f"needs a supported GPU: {gpu_problem()}")


def parsed_bindings(onnx_path: Path, dist: Distribution) -> dict:
    """{name: (mode, dtype, shape)}: the inputs and outputs of the network the real parser makes
    of `onnx_path`, which are the bindings of every engine built from it."""
    from edgecap.export.tensorrt import _build_log, _parse, network_bindings

    trt = load(dist, "tests")
    build_log = _build_log(trt)
    network, _parser, problems = _parse(trt, trt.Builder(build_log), build_log, onnx_path, strongly_typed=True)
    assert not problems, problems
    return network_bindings(trt, network)
