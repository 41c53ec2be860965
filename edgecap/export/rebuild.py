"""Rebuild a bundle's TensorRT engines from its own ONNX graphs, without the checkpoint.

For the robot: an engine only runs with the TensorRT version and GPU it was built for, so a
bundle moved to another Jetson is rebuilt in place with
`edgecap export BUNDLE --engine trt --force` (`--tensorrt tensorrt-rtx` for TensorRT for RTX).
No PyTorch here; the parity check compares the new engines against the bundle's onnxruntime
graphs on seeded random inputs, where this machine can run them (a TensorRT for RTX rebuild
without a supported GPU records why it did not).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.manifest import (
    MANIFEST_NAME,
    ROW_ROLES,
    GraphEntry,
    Manifest,
    ParityReport,
    load_manifest,
)
from edgecap.errors import EdgecapError
from edgecap.export import compat
from edgecap.export.result import ExportResult
from edgecap.io import BUNDLE, KINDS, atomic_dir
from edgecap.runtime.tensorrt_dist import DISTRIBUTIONS, choose, installed, load


def random_model_inputs(manifest: Manifest, seed: int = 0) -> tuple[tuple, tuple]:
    """(front-end inputs, extra encode inputs) with the static shapes the manifest records."""
    rng = np.random.default_rng(seed)

    def make(spec):
        if spec.dtype == "bool":
            return np.ones(spec.shape, bool)
        if spec.dtype.startswith("int"):
            return rng.integers(0, len(manifest.vocab.itos), spec.shape).astype(spec.dtype)
        return rng.standard_normal(spec.shape).astype(spec.dtype)

    encoder = [make(t) for t in manifest.graph("encoder").inputs]
    front = tuple(make(t) for t in manifest.graph("visual").inputs) if manifest.input == "images" else tuple(encoder[:2])
    return front, tuple(encoder[2:])


def compare_engines(root: Path, samples: int, precision: str) -> dict:
    from edgecap.runtime.session import Bundle

    ort_b = Bundle.load(root, providers=["CPUExecutionProvider"], engine="onnxruntime")
    trt_b = Bundle.load(root, engine="tensorrt")
    same, delta = [], 0.0
    options = DecodeOptions(beam_size=ort_b.beam_size, max_len=ort_b.max_len)
    for i in range(max(1, samples // ort_b.batch_size)):
        front, extra = random_model_inputs(ort_b.manifest, seed=i)
        outs = []
        for b in (ort_b, trt_b):
            feats, mask = b.visual(front[0]) if b.has_visual else front
            cross = b.encode(feats, mask, *extra)
            outs.append((cross, b.decode(cross, options)))
        delta = max(delta, *(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                             for x, y in zip(outs[0][0], outs[1][0], strict=False) if np.asarray(x).size))
        same += [bool(np.array_equal(a, b)) for a, b in zip(outs[0][1].best(), outs[1][1].best(), strict=False)]
    report = {"precision": precision, "inputs": "random inputs (engines vs the bundle's onnxruntime graphs)",
              "samples": len(same), "beam_identical": float(np.mean(same)), "encoder_max_abs_delta": delta}
    report["passed"] = precision != "fp32" or report["beam_identical"] == 1.0
    return report


def require_buildable(bundle_dir: Path, files: list[str], tensorrt: str = "auto") -> None:
    """Refuse, naming each graph and its first problem, a bundle whose ONNX graphs TensorRT
    cannot parse: an onnxruntime int8 bundle (dynamic: MatMulInteger; weight-only: the
    MatMulNBits contrib op). The installed TensorRT's parser judges (edgecap's list where none
    imports, so a machine without TensorRT gets the answer too)."""
    bad = [r for r in (compat.check_file(bundle_dir / f, run_polygraphy=False, tensorrt=tensorrt) for f in files)
           if not r.ok]
    if bad:
        found = "; ".join(f"{r.file}: {r.problems[0]}" + (f" (+{len(r.problems) - 1} more)" if len(r.problems) > 1 else "")
                          for r in bad)
        raise EdgecapError(f"{bundle_dir} holds graphs that are not TensorRT-compatible ({found}); TensorRT engines "
                           "are built from fp32 or static-QDQ graphs: export the checkpoint with --engine trt")


def rebuilt_precision(bundle_dir: Path, graphs: list[GraphEntry], asked: str) -> str:
    """The precision the rebuilt engines compute in: their ONNX graphs' own (TensorRT builds
    strongly typed engines), which must be what the engines they replace were; -> the lowest
    of them, for the report. `asked` is --precision: fp32 (the default) or the graphs' one."""
    sources = {g.role: g.precision for g in graphs if g.engine == "onnxruntime"}
    held = sorted(set(sources.values()))
    if asked != "fp32" and asked not in held:
        raise EdgecapError(f"the ONNX graphs in {bundle_dir} are {'/'.join(held)}: rebuilt engines keep their "
                           f"graphs' precision; for {asked} engines export the checkpoint with --engine trt "
                           f"--precision {asked}")
    for g in graphs:
        if g.engine == "tensorrt" and g.precision != sources.get(g.role, g.precision):
            raise EdgecapError(f"{bundle_dir}: engine {g.file} is {g.precision} but its ONNX graph is "
                               f"{sources[g.role]} (TensorRT lowered the precision itself, which TensorRT 11 "
                               f"no longer does); export the checkpoint again with --engine trt --precision "
                               f"{g.precision}")
    return next((p for p in ("int8", "fp16") if p in held), "fp32")


def _require_bundle(directory: Path) -> None:
    """A directory given to export is a bundle whose engines to rebuild, or it is refused
    saying what it is (another edgecap directory, or anything else)."""
    if BUNDLE.owns(directory):
        return
    other = next((kind for kind in KINDS if kind.owns(directory)), None)
    what = (f"an edgecap {other.what}, not a bundle" if other else
            f"a directory, not an edgecap bundle (no {BUNDLE.marker} of ours)")
    raise EdgecapError(f"{directory} is {what}; export takes a checkpoint file (.pt), or a bundle to rebuild "
                       "its TensorRT engines")


def rebuild_engines(bundle_dir: Path, settings, progress: bool = True):
    from edgecap.export.tensorrt import (
        build_engine,
        engine_name,
        engines_not_run,
        require_options,
        timing_cache_path,
    )

    _require_bundle(bundle_dir)
    if settings.engine != "trt":
        raise EdgecapError(f"{bundle_dir} is a bundle: only its TensorRT engines can be rebuilt (--engine trt)")
    manifest = load_manifest(bundle_dir)
    out = Path(settings.out) if settings.out else bundle_dir
    if out.resolve() == bundle_dir.resolve() and not settings.force:
        raise EdgecapError(f"rebuilding replaces the engines in {bundle_dir}; pass --force (or --out DIR)")
    if settings.precision == "int8" and settings.int8_mode == "calibrator":
        raise EdgecapError("rebuilding from a bundle supports --int8-mode qdq only (the calibrator needs the checkpoint)")
    sources = [g for g in manifest.graphs if g.engine == "onnxruntime"]
    # the parser of the TensorRT asked for judges where it imports; else any (or edgecap's list)
    judge = settings.tensorrt if settings.tensorrt == "auto" or installed(DISTRIBUTIONS[settings.tensorrt]) else "auto"
    require_buildable(bundle_dir, [g.file for g in sources], judge)
    precision = rebuilt_precision(bundle_dir, manifest.graphs, settings.precision)
    dist = choose(settings.tensorrt, "--engine trt")
    require_options(load(dist, "--engine trt"), precision, "qdq", settings.timing_cache)
    engines = {g.file for g in manifest.graphs if g.engine == "tensorrt"}
    with atomic_dir(out, BUNDLE, force=settings.force) as tmp:
        # everything but the old engines: the graphs and a RA-T bundle's retrieval assets
        for file in [f for f, _ in manifest.files() if f not in engines]:
            (tmp / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(bundle_dir / file, tmp / file)
        rebuilt = replace(manifest, graphs=list(sources))
        cache = timing_cache_path(settings, out, dist)
        for g in sources:
            rows = manifest.batch_size * (manifest.beam_size if g.role in ROW_ROLES else 1)
            name = engine_name(g.role, rows, g.precision)
            info = build_engine(tmp / g.file, tmp / name, g.precision, dist, settings.workspace, cache, "qdq",
                                source_entry=g, progress=progress)
            rebuilt.graphs.append(GraphEntry.of_file(g.role, name, tmp, "tensorrt", g.precision, g.inputs, g.outputs,
                                                     g.opset, source=g.file, tensorrt=info))
        rebuilt.write(tmp)
        report = engines_not_run(rebuilt, tmp, precision, out)
        if report is None:  # the engines run here: compared with the ONNX graphs
            report = ParityReport.from_dict(compare_engines(tmp, settings.samples, precision), "rebuilt engines' parity")
            if not report.passed:
                raise EdgecapError(f"rebuilt fp32 engines caption differently from the ONNX graphs "
                                   f"({report.beam_identical:.0%} identical); bundle left unchanged")
        rebuilt.parity = {**manifest.parity, "tensorrt": report}
        rebuilt.write(tmp)
    return ExportResult(out, rebuilt)


__all__ = ["rebuild_engines", "compare_engines", "MANIFEST_NAME"]
