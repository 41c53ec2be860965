"""Which TensorRT: full TensorRT or TensorRT for RTX. Every difference between the two lives here.

- TensorRT (`tensorrt`, pip extra `trt`; JetPack ships it on a Jetson): builds on the GPU it
  will run on, for that GPU's compute capability alone; a timing cache keeps the builder's
  kernel timings across builds.
- TensorRT for RTX (`tensorrt_rtx`, pip extra `trt-rtx`; PyPI wheels with the libraries
  inside): builds without a GPU, for a list of compute capabilities (Ampere 8.0/8.6, Ada 8.9,
  Blackwell 12.x); its engines refuse every other GPU (a datacenter Hopper 9.0, a Jetson Orin
  8.7). Networks are always strongly typed, it has no timing cache (its builder calls for one
  are no-ops) and compiles kernels when an engine first runs, kept in a runtime cache.

`--tensorrt auto` (the default) takes `tensorrt` when it imports, else `tensorrt_rtx`. An API
"release" is a distribution and its major (`tensorrt-10`, `tensorrt-11`, `tensorrt-rtx-1`): code
that runs on some releases only is marked `@trt_apis(...)` (edgecap.export.tensorrt), and the
offline API check (benchmarks/_trt_api.py) holds it to those releases alone. Torch-free.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass

from edgecap.errors import EdgecapError, did_you_mean, require


@dataclass(frozen=True)
class Distribution:
    name: str  # the manifest's `tensorrt.distribution` and the --tensorrt value
    module: str  # its Python module
    title: str
    extra: str  # the pip extra that installs it
    pip: str  # the requirement, for messages
    majors: tuple[int, ...]  # the majors whose API edgecap's engine code was checked against
    needs_gpu_to_build: bool  # False: builds for a list of compute capabilities, GPU or not
    cache: str  # "timing" (the builder's kernel timings) | "runtime" (kernels compiled at first run)
    implicit_int8_majors: tuple[int, ...] = ()  # majors with the INT8 calibrator (weakly typed INT8)
    lowest_cc: tuple[int, int] = (0, 0)  # the oldest compute capability edgecap builds for

    def release(self, version: str) -> str:
        """The API release of `version`: 'tensorrt-10', 'tensorrt-rtx-1', ..."""
        return f"{self.name}-{tensorrt_major(version)}"

    @property
    def releases(self) -> tuple[str, ...]:
        return tuple(f"{self.name}-{m}" for m in self.majors)

    def describe(self, version: str) -> str:
        return f"{self.title} {version}"


TENSORRT = Distribution(
    name="tensorrt", module="tensorrt", title="TensorRT", extra="trt", pip="tensorrt>=10,<12", majors=(10, 11),
    needs_gpu_to_build=True, cache="timing", implicit_int8_majors=(10,))  # 11 removed the INT8 calibrators
# Turing (7.5) is left out: TensorRT for RTX cannot compile an fp32 GEMM for it
TENSORRT_RTX = Distribution(
    name="tensorrt-rtx", module="tensorrt_rtx", title="TensorRT for RTX", extra="trt-rtx",
    pip="tensorrt-rtx-cu13>=1.7,<2", majors=(1,), needs_gpu_to_build=False, cache="runtime", lowest_cc=(8, 0))

DISTRIBUTIONS = {d.name: d for d in (TENSORRT, TENSORRT_RTX)}
CHOICES = ("auto", *DISTRIBUTIONS)
# every API release edgecap's TensorRT code runs on
SUPPORTED_RELEASES = tuple(r for d in DISTRIBUTIONS.values() for r in d.releases)
TENSORRT_RELEASES = TENSORRT.releases
RTX_RELEASES = TENSORRT_RTX.releases
IMPLICIT_INT8_RELEASES = tuple(f"tensorrt-{m}" for m in TENSORRT.implicit_int8_majors)


def trt_apis(*releases: str):
    """Mark a function whose TensorRT calls exist on these API releases only ('tensorrt-10',
    'tensorrt-rtx-1', ...): the offline API check (benchmarks/_trt_api.py) checks its uses
    against those releases alone."""
    def mark(fn):
        fn.trt_apis = releases
        return fn
    return mark


def tensorrt_major(version: str) -> int:
    match = re.match(r"(\d+)\.", str(version))
    return int(match.group(1)) if match else -1


def installed(dist: Distribution) -> bool:
    if sys.modules.get(dist.module) is not None:  # imported already (or put there by a test)
        return True
    try:
        return importlib.util.find_spec(dist.module) is not None
    except (ImportError, ValueError):
        return False


def install_hint() -> str:
    return ('pip install "edgecap[trt]" (TensorRT: Jetson, datacenter GPUs) or "edgecap[trt-rtx]" '
            "(TensorRT for RTX: Ampere, Ada and Blackwell RTX GPUs; builds without a GPU)")


def choose(choice: str = "auto", purpose: str = "TensorRT engines") -> Distribution:
    """The distribution `--tensorrt CHOICE` names; auto: tensorrt when it imports, else
    tensorrt_rtx; neither installed is a one-line error naming both extras."""
    if choice != "auto":
        if choice not in DISTRIBUTIONS:
            raise EdgecapError(f"--tensorrt {choice!r}: expected one of {', '.join(CHOICES)}"
                               f"{did_you_mean(choice, CHOICES)}")
        return DISTRIBUTIONS[choice]
    for dist in DISTRIBUTIONS.values():
        if installed(dist):
            return dist
    raise EdgecapError(f"no TensorRT is installed ({purpose}): {install_hint()}")


def available() -> Distribution | None:
    """The distribution --tensorrt auto would take, or None when neither is installed."""
    return next((d for d in DISTRIBUTIONS.values() if installed(d)), None)


def load(dist: Distribution, purpose: str):
    """The distribution's module, if it is a release edgecap supports; else a one-line error."""
    module = require(dist.module, dist.extra, purpose)
    version = getattr(module, "__version__", "unknown")
    if tensorrt_major(version) not in dist.majors:
        majors = " or ".join(f"{m}.x" for m in dist.majors)
        raise EdgecapError(f"{dist.describe(version)} is not supported ({purpose}): edgecap builds and runs engines "
                           f"with {dist.title} {majors} (pip install \"{dist.pip}\")")
    return module


def of_module(module) -> Distribution:
    """The distribution a loaded module belongs to (its name, or its bindings' name)."""
    name = getattr(module, "__name__", "")
    return TENSORRT_RTX if name.split(".")[-1].startswith("tensorrt_rtx") else TENSORRT


def release_of(module) -> str:
    return of_module(module).release(getattr(module, "__version__", ""))


@trt_apis(*RTX_RELEASES)
def compute_capabilities(trt) -> list[str]:
    """The compute capabilities a TensorRT for RTX build targets: every one its
    ComputeCapability enum names from `lowest_cc` on ('8.0', '8.6', ...)."""
    found = []
    for name in trt.ComputeCapability.__members__:
        match = re.fullmatch(r"SM(\d+)(\d)", name)
        if match and (int(match.group(1)), int(match.group(2))) >= TENSORRT_RTX.lowest_cc:
            found.append((int(match.group(1)), int(match.group(2))))
    return [f"{major}.{minor}" for major, minor in sorted(found)]
