"""Check edgecap's TensorRT and CUDA calls against the real Python bindings of any release, offline.

TensorRT cannot run without an NVIDIA GPU, but each release's Python bindings are a wheel on
PyPI (`tensorrt-cu12-bindings`: the pybind11 module `tensorrt_bindings/tensorrt.so`). The
module only needs libnvinfer / libnvonnxparser / libnvinfer_plugin to load, and defining its
classes calls none of their functions, so it imports against empty stand-ins of those
libraries (compiled here with `cc`, exporting the entry points the bindings link to). The
module is then the real one: its classes, methods, properties, enum members and the
signatures pybind11 wrote into the docstrings. Every TensorRT use edgecap's source makes
(`benchmarks/_trt_api.py`'s `api_uses`) is checked against it, each release in its own process.
The same for cuda-python's runtime module (`cuda-bindings` wheels import without a GPU).

    python benchmarks/trt_api_check.py --download 10.0.1 10.3.0 10.16.1.11 11.0.0.114 11.4.0.106 \
        --cuda-download 12.9.10 13.5.0            # pip download into ~/.cache/edgecap/bindings
    python benchmarks/trt_api_check.py DIR_OR_WHEEL ...   # bindings already downloaded

Prints a markdown table (release, uses checked, problems) and exits 1 when a release edgecap
supports lacks something it uses.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgecap" / "bindings"
# the libnvinfer / parser / plugin entry points the bindings of 10.x and 11.x link to
STUB_C = """
void *createInferBuilder_INTERNAL(void *a, int b) { return 0; }
void *createInferRefitter_INTERNAL(void *a, void *b, int c) { return 0; }
void *createInferRuntime_INTERNAL(void *a, int b) { return 0; }
void *createNvOnnxParserRefitter_INTERNAL(void *a, void *b, int c) { return 0; }
void *createNvOnnxParser_INTERNAL(void *a, void *b, int c) { return 0; }
void *getBuilderPluginRegistry(int a) { return 0; }
int getNvOnnxParserVersion(void) { return 0; }
void *getPluginRegistry(void) { return 0; }
int initLibNvInferPlugins(void *a, const char *b) { return 0; }
"""
STUB_LIBS = ("nvinfer", "nvonnxparser", "nvinfer_plugin")

# run in a child process: one release's shared library per process
CHILD = """
import json, os, sys
sys.setdlopenflags(os.RTLD_LAZY)  # a stand-in misses an entry point: fail only if called
sys.path.insert(0, sys.argv.pop(3))  # benchmarks/, for _trt_api
import _trt_api as trt_api
sources = sys.argv[3:] or trt_api.SOURCES
if sys.argv[1] == "tensorrt":
    import importlib
    trt = importlib.import_module(sys.argv[2])
    uses = [u for u in trt_api.api_uses(sources) if u.owner != trt_api.CUDA_ROLE]
    release = trt_api.release_of(trt)
    checked = [u for u in uses if release in u.apis]
    print(json.dumps({"version": trt.__version__, "release": release, "checked": len({u.name for u in checked}),
                      "uses": len(checked), "problems": trt_api.missing_api(trt, uses)}))
else:
    from cuda.bindings import runtime as cudart
    from importlib.metadata import version
    uses = [u for u in trt_api.api_uses(sources) if u.owner == trt_api.CUDA_ROLE]
    print(json.dumps({"version": version("cuda-bindings"), "checked": len({u.name for u in uses}),
                      "uses": len(uses), "problems": trt_api.missing_cuda_api(cudart, uses)}))
"""


def download(package: str, version: str) -> Path:
    dest = CACHE / f"{package}-{version}"
    if not any(dest.glob("*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--python-version", f"{sys.version_info.major}{sys.version_info.minor}",
                        f"{package}=={version}", "-d", str(dest), "-q"], check=True)
    return next(dest.glob("*.whl"))


def unpack(source: Path, work: Path) -> Path:
    """A directory holding the wheel's packages."""
    if source.is_dir():
        return source
    out = work / source.stem
    with zipfile.ZipFile(source) as whl:
        whl.extractall(out)
    return out


def tensorrt_package(root: Path) -> tuple[str, str]:
    """(import name, version) of the bindings under root."""
    for name in ("tensorrt_bindings", "tensorrt"):
        init = root / name / "__init__.py"
        if init.is_file() and any((root / name).glob("tensorrt*.so")):
            version = re.search(r'__version__ = "([^"]+)"', init.read_text())
            return name, version.group(1) if version else "unknown"
    raise SystemExit(f"{root}: no tensorrt_bindings/ or tensorrt/ package with its tensorrt*.so")


def stub_libraries(major: str, work: Path) -> Path:
    out = work / f"stubs-{major}"
    if out.is_dir():
        return out
    out.mkdir()
    source = out / "stub.c"
    source.write_text(STUB_C)
    for lib in STUB_LIBS:
        soname = f"lib{lib}.so.{major}"
        try:
            subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out / soname), f"-Wl,-soname,{soname}", str(source)],
                           check=True)
        except FileNotFoundError:
            raise SystemExit("this check needs a C compiler (cc) to make stand-ins for the TensorRT libraries") from None
    return out


def run_child(kind: str, module: str, pythonpath: Path, libs: Path | None, sources: list[Path]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pythonpath), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if libs is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libs), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", CHILD, kind, module, here, *map(str, sources)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"version": pythonpath.name, "release": "", "checked": 0, "uses": 0,
                "problems": [f"could not import: {last}"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from edgecap.runtime.tensorrt_dist import SUPPORTED_RELEASES, tensorrt_major

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bindings", nargs="*", type=Path, help="tensorrt-cu12-bindings wheels or unpacked directories")
    p.add_argument("--download", nargs="*", default=[], metavar="VERSION", help="tensorrt-cu12-bindings releases")
    p.add_argument("--cuda", nargs="*", default=[], type=Path, help="cuda-bindings wheels or unpacked directories")
    p.add_argument("--cuda-download", nargs="*", default=[], metavar="VERSION", help="cuda-bindings releases")
    p.add_argument("--sources", nargs="*", default=[], type=Path,
                   help="the TensorRT code to read (default: edgecap's export/tensorrt.py and runtime/engines.py)")
    args = p.parse_args(argv)
    trt_sources = list(args.bindings) + [download("tensorrt-cu12-bindings", v) for v in args.download]
    cuda_sources = list(args.cuda) + [download("cuda-bindings", v) for v in args.cuda_download]
    if not trt_sources and not cuda_sources:
        p.error("name bindings to check (paths, --download or --cuda-download)")
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="trt-api-") as tmp:
        work = Path(tmp)
        for source in trt_sources:
            root = unpack(source, work)
            module, version = tensorrt_package(root)
            major = str(tensorrt_major(version))
            result = run_child("tensorrt", module, root, stub_libraries(major, work), args.sources)
            supported = result.get("release") in SUPPORTED_RELEASES
            failed |= supported and bool(result["problems"])
            rows.append(("tensorrt", result, supported))
        for source in cuda_sources:
            result = run_child("cuda", "cuda.bindings.runtime", unpack(source, work), None, args.sources)
            failed |= bool(result["problems"])
            rows.append(("cuda-bindings", result, True))
    print("| bindings | release | names checked (uses) | problems |")
    print("|---|---|---|---|")
    for kind, r, supported in rows:
        problems = "; ".join(r["problems"]) or "none"
        note = "" if supported else " (not a supported major)"
        print(f"| {kind} | {r['version']}{note} | {r['checked']} ({r['uses']}) | {problems} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
