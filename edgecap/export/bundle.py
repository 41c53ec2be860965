"""Write a bundle directory: graphs, (engines), manifest.json, parity report — all or nothing.

Everything is written into a temporary directory beside the target and renamed onto it only
after the parity gate passed (`edgecap.io.atomic_dir`), so a failed or interrupted export
leaves no partial bundle; an existing bundle is replaced only with --force, and nothing that
is not an edgecap bundle is ever replaced.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from edgecap.contract.manifest import (
    FORMAT_VERSION,
    ROW_ROLES,
    CoverageVectors,
    DecodingDefaults,
    DecodingState,
    GraphCheck,
    GraphEntry,
    Manifest,
    ModelInfo,
    ParityNotRun,
    ParityReport,
    RetrievalAssets,
    Versions,
    Vocabulary,
)
from edgecap.errors import EdgecapError, require
from edgecap.export import compat
from edgecap.export.attach import attach_frontend
from edgecap.export.formats import ExportSettings
from edgecap.export.rebuild import rebuild_engines
from edgecap.export.result import ExportResult
from edgecap.io import BUNDLE, atomic_dir, check_replaceable, probe_writable, sha256_file
from edgecap.metrics.subset import write_bundle_vectors
from edgecap.progress import progress_bar
from edgecap.runtime.tensorrt_dist import DISTRIBUTIONS, choose, installed, load

if TYPE_CHECKING:  # the types of ExportState's fields (imported where the steps use them)
    from tqdm import tqdm

    from edgecap.export.specs import ExportSpec, GraphSpec
    from edgecap.export.verify import ParityInputs
    from edgecap.models.checkpoint import Checkpoint

__all__ = ["ExportResult", "check_writable", "default_out", "export_bundle", "versions"]


def check_writable(out: Path, force: bool, hint: str = "") -> None:
    """Fail before the slow work when the bundle could not be written."""
    try:
        check_replaceable(out, BUNDLE, force)
        probe_writable(out)
    except EdgecapError as exc:
        raise EdgecapError(f"{exc}{hint}") from None


def default_out(checkpoint: Path, s: ExportSettings) -> Path:
    """Beside the checkpoint (runs/demo/best.pt -> runs/demo/best-onnx-fp32-b1k3), not in the
    working directory, which is often a source checkout the bundle does not belong in."""
    return checkpoint.with_name(f"{checkpoint.stem}-{s.engine}-{s.precision}-b{s.batch}k{s.beam}")


def versions() -> Versions:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("edgecap", "torch", "onnx", "onnxruntime", "onnxscript"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    for dist in DISTRIBUTIONS.values():  # the modules' own versions: their wheels' names carry the CUDA major
        if installed(dist):
            out[dist.name] = getattr(importlib.import_module(dist.module), "__version__", "unknown")
    return Versions.from_dict(out, "versions")  # keyed as the manifest writes them ("tensorrt-rtx")


def _progress(total: int, enabled: bool):
    return progress_bar(total=total, desc="export", unit="step", leave=False, quiet=not enabled)


def _check(path: Path, checks: dict[str, GraphCheck], trt: bool, ranges: dict | None = None,
           run_polygraphy: bool = False, tensorrt: str = "auto") -> None:
    """Record in the manifest's `checks` what TensorRT's parser (edgecap's list where no TensorRT
    imports) makes of the graph at `path`; when building engines, refuse a graph it cannot build."""
    report = compat.check_file(path, ranges, run_polygraphy=run_polygraphy, tensorrt=tensorrt)
    checks[path.name] = GraphCheck(report.ok, list(report.problems), report.checked_by)
    if trt:
        compat.require_compatible([report])


@dataclass
class ExportState:
    """What the steps of one checkpoint export share: each step reads it and adds to it."""

    checkpoint: Path
    settings: ExportSettings
    ckpt: Checkpoint
    spec: ExportSpec
    inputs: ParityInputs
    graphs: list[GraphSpec]  # the spec's graphs (made once: tracing them draws random inputs)
    tmp: Path  # the work directory, renamed onto the bundle when every step passed
    bar: tqdm  # the export's progress (quiet: tqdm's no-op mode)
    manifest: Manifest | None = None
    checks: dict[str, GraphCheck] = field(default_factory=dict)
    feeds: dict | None = None  # calibration inputs per graph role, recorded from the fp32 bundle
    front_int8: dict | None = None  # the static-int8 front end's record (edgecap.export.front_int8)
    out: Path | None = None  # the bundle directory it becomes (TensorRT's timing cache goes beside it)
    progress: bool = False

    @property
    def tensorrt(self) -> str:
        """The distribution whose parser checks the graphs: the one building engines, else any."""
        return _distribution(self.settings).name if self.trt else "auto"

    @property
    def trt(self) -> bool:
        return self.settings.format.name == "trt"

    @property
    def calibrated(self) -> bool:
        """TensorRT's int8 calibrator builds its int8 from the fp32 graphs."""
        return self.trt and self.settings.precision == "int8" and self.settings.int8_mode == "calibrator"

    @property
    def onnx_precision(self) -> str:
        """TensorRT builds strongly typed engines from the ONNX graphs at their own precision;
        only its calibrator builds int8 from fp32."""
        return "fp32" if self.calibrated else self.settings.precision

    @property
    def onnx_quantize(self) -> str:
        return "static" if self.trt else self.settings.quantize  # TensorRT builds int8 from static QDQ

    @property
    def needs_feeds(self) -> bool:
        return (self.onnx_precision == "int8" and self.onnx_quantize == "static") or self.calibrated

    @cached_property
    def np_batches(self) -> list:
        return [tuple(x.numpy() for x in b) for b in self.inputs.batches]


def _distribution(settings: ExportSettings):
    """The TensorRT distribution --tensorrt names (auto: tensorrt, else tensorrt_rtx)."""
    return choose(settings.tensorrt, "--engine trt")


def _require_engine(settings: ExportSettings) -> None:
    """A missing or unsupported TensorRT (or other engine library), or an option the installed
    one cannot honour, said before any work."""
    fmt = settings.format
    if fmt.name == "trt":
        from edgecap.export.tensorrt import require_options

        trt = load(_distribution(settings), "--engine trt")
        require_options(trt, settings.precision, settings.int8_mode, settings.timing_cache)
    elif fmt.requires != "onnxruntime":
        require(fmt.requires, fmt.extra, f"--engine {fmt.name}")


def _load_model(checkpoint: Path, settings: ExportSettings):
    """-> (checkpoint, export spec, parity inputs), with the native libraries imported before
    the work directory exists: a SIGTERM raised while one of them is importing crosses C++
    (nanobind) and aborts the process, skipping cleanup."""
    require("torch", "train", "export")
    import torch

    require("onnx", "train", "ONNX export")
    require("onnxruntime", "train", "the parity gate")
    import edgecap.export.onnx  # noqa: F401
    import edgecap.runtime.session  # noqa: F401
    from edgecap.export.specs import spec_for
    from edgecap.export.verify import load_parity_inputs
    from edgecap.models.checkpoint import check_finite, load_checkpoint

    torch.manual_seed(0)
    ckpt = load_checkpoint(checkpoint)
    if settings.frontend:
        for note in attach_frontend(ckpt, settings.frontend, settings.visual_weights, settings.image_size):
            print(f"note: {note}", file=sys.stderr)
    check_finite(ckpt.model.state_dict(), f"checkpoint {checkpoint}", "a bundle of it would caption nothing "
                 "(train again, or export an earlier checkpoint)")
    spec = spec_for(ckpt.model, settings.batch, settings.beam)
    inputs = load_parity_inputs(spec, settings.samples, settings.data, ckpt.meta, checkpoint=checkpoint)
    return ckpt, spec, inputs


def _export_graphs(s: ExportState) -> None:
    """fp32 ONNX graphs, checked for static shapes and TensorRT-compatible ops, and the
    manifest that describes them."""
    from edgecap.export.onnx import export_graph

    cfg = s.ckpt.config
    ranges = {"token": (0, cfg.vocab_size - 1), "step": (0, cfg.max_len - 1), "parent": (0, s.spec.rows - 1)}
    infos = {}
    for g in s.graphs:
        s.bar.set_postfix_str(f"onnx {g.role}")
        infos[g.role] = export_graph(g, s.tmp / f"{g.role}.onnx", s.settings.opset, s.settings.exporter)
        _check(s.tmp / f"{g.role}.onnx", s.checks, s.trt, ranges, run_polygraphy=s.trt, tensorrt=s.tensorrt)
        s.bar.update()
    s.manifest = _new_manifest(s, infos)


def _new_manifest(s: ExportState, infos: dict) -> Manifest:
    cfg, vocab, settings = s.ckpt.config, s.ckpt.vocab, s.settings
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        model=ModelInfo(cfg.name, cfg.family, cfg.decoder, cfg.to_dict(), s.ckpt.model.num_parameters(),
                        s.checkpoint.name),
        input="images" if s.spec.takes_images else "features",
        batch_size=settings.batch, beam_size=settings.beam, max_len=cfg.max_len,
        vocab=Vocabulary(list(vocab.itos), vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id),
        preprocessing=s.spec.preprocessing(),
        frontend=s.spec.frontend(),
        decoding=DecodingDefaults(beam_size=settings.beam, max_len=cfg.max_len, length_penalty=0.0),
        state=DecodingState.of(s.ckpt.model.state, s.spec.top_k, s.spec.extra_names,
                               update="cache_update" if "cache_update" in infos else "host"),
        graphs=[GraphEntry.of_file(role, f"{role}.onnx", s.tmp, "onnxruntime", "fp32", **info)
                for role, info in infos.items()],
        checks=s.checks,
        target=settings.target,
        versions=versions(),
    )
    retrieval = s.spec.assets(s.tmp, vocab)
    if retrieval:
        hashes = {retrieval[k]: sha256_file(s.tmp / retrieval[k]) for k in ("index", "tokens")}
        manifest.retrieval = RetrievalAssets.from_dict({**retrieval, "sha256": hashes}, "retrieval assets")
    manifest.coverage = _coverage_vectors(s.tmp, vocab.itos)
    return manifest


def _coverage_vectors(tmp: Path, itos) -> CoverageVectors | None:
    """The word vectors coverage needs for this vocabulary (edgecap.metrics.subset), so a robot
    loads a few hundred kB instead of the 400,000-word table; None without edgecap[nlp]."""
    from edgecap.metrics.glove import SUBSET_FILE

    words = write_bundle_vectors(tmp, itos, SUBSET_FILE)
    return None if words is None else CoverageVectors(SUBSET_FILE, sha256_file(tmp / SUBSET_FILE), words)


def _check_calibration_folder(s: ExportState) -> None:
    """Said before the slow work: a --calibration folder that would go unused."""
    from edgecap.export.front_int8 import check_calibration

    check_calibration(s.settings.calibration, s.tmp / "visual.onnx")


def _record_calibration_feeds(s: ExportState) -> None:
    """The inputs each graph sees while the fp32 bundle captions the parity inputs: static int8's
    and TensorRT's calibrator's calibration data."""
    from edgecap.export.calibration import record_feeds
    from edgecap.runtime.session import Bundle

    s.bar.set_postfix_str("calibration inputs")
    s.feeds = record_feeds(Bundle.load(s.tmp, providers=["CPUExecutionProvider"], engine="onnxruntime"),
                           s.np_batches)


def _reduce_precision(s: ExportState) -> None:
    """The ONNX graphs rewritten in place at the reduced precision."""
    for entry in s.manifest.graphs:
        if entry.role == "cache_update":  # data movement only: the fp32 cache stays fp32
            continue
        s.bar.set_postfix_str(f"{s.onnx_precision} {entry.role}")
        entry.precision = _reduce_graph(s, entry)
        entry.sha256 = sha256_file(s.tmp / entry.file)
        # the checks describe the graph the bundle holds: dynamic int8's integer MatMuls
        # and weight-only's contrib ops are not TensorRT's
        _check(s.tmp / entry.file, s.checks, s.trt, tensorrt=s.tensorrt)


def _reduce_graph(s: ExportState, entry: GraphEntry) -> str:
    """Rewrite one graph; -> the precision it holds now."""
    from edgecap.export.quantize import convert_fp16, graph_mode, is_convolutional, quantize_int8

    path = s.tmp / entry.file
    if entry.role == "visual" and s.onnx_precision == "int8" and not s.trt and is_convolutional(path):
        return _quantize_front_end(s, path)
    if s.onnx_precision == "fp16":
        return convert_fp16(path, path)
    return quantize_int8(path, path, graph_mode(s.onnx_quantize, entry.role), (s.feeds or {}).get(entry.role),
                         quantize_bias=not s.trt)  # TensorRT's QDQ keeps biases float


def _quantize_front_end(s: ExportState, path: Path) -> str:
    """A convolutional front end: static int8 where that pays, measured against fp32."""
    from edgecap.export.front_int8 import quantize_visual

    s.front_int8 = quantize_visual(path, s.spec, s.settings.calibration, s.inputs, s.np_batches, s.ckpt.meta,
                                   s.settings.beam)
    return s.front_int8["precision"]


def _build_engines(s: ExportState) -> None:
    """TensorRT engines beside their ONNX source."""
    from edgecap.export.tensorrt import build_engine, engine_name, timing_cache_path

    settings, dist = s.settings, _distribution(s.settings)
    cache = timing_cache_path(settings, s.out or s.tmp, dist)
    for entry in list(s.manifest.graphs):
        s.bar.set_postfix_str(f"tensorrt {entry.role}")
        rows = settings.batch * (settings.beam if entry.role in ROW_ROLES else 1)
        # the cache_update graph moves fp32 data and computes nothing: an fp32 engine at any precision
        precision = "fp32" if entry.role == "cache_update" else settings.precision
        name = engine_name(entry.role, rows, precision)
        info = build_engine(s.tmp / entry.file, s.tmp / name, precision, dist, settings.workspace, cache,
                            settings.int8_mode, (s.feeds or {}).get(entry.role), source_entry=entry,
                            progress=s.progress)
        s.manifest.graphs.append(GraphEntry.of_file(entry.role, name, s.tmp, "tensorrt", precision,
                                                    entry.inputs, entry.outputs, entry.opset,
                                                    source=entry.file, tensorrt=info))
        s.bar.update()


def _gate_parity(s: ExportState) -> None:
    """The parity gate, on every engine the bundle carries; the reports go into the manifest."""
    parity = {}
    for engine in ["onnxruntime"] + (["tensorrt"] if s.trt else []):
        s.bar.set_postfix_str(f"parity {engine}")
        parity[engine] = _engine_parity(s, engine)
        s.bar.update()
    s.manifest.parity = parity


def _engine_parity(s: ExportState, engine: str) -> ParityReport | ParityNotRun:
    from edgecap.export.tensorrt import engines_not_run
    from edgecap.export.verify import parity_gate, require_parity
    from edgecap.runtime.session import Bundle

    precision = s.settings.precision if engine == "tensorrt" else s.onnx_precision
    if engine == "tensorrt":
        not_run = engines_not_run(s.manifest, s.tmp, precision, s.out)
        if not_run is not None:
            return not_run
    bundle = Bundle.load(s.tmp, providers=["CPUExecutionProvider"], engine=engine)
    report = parity_gate(s.spec, bundle, s.inputs, precision, s.ckpt.vocab)
    if precision == "int8":  # which int8: onnxruntime's quantization or TensorRT's int8 mode
        report["quantize"] = s.settings.int8_mode if engine == "tensorrt" else s.onnx_quantize
    if s.front_int8 is not None and engine == "onnxruntime":
        report["front_end_int8"] = s.front_int8
    require_parity(report)
    return ParityReport.from_dict(report, f"parity report of {engine}")


def _steps(s: ExportState) -> tuple:
    """The export's steps in order, each with whether this export takes it (as ultralytics'
    exporter picks its per-format export functions)."""
    return ((_export_graphs, True),
            (_check_calibration_folder, bool(s.settings.calibration)),
            (_record_calibration_feeds, s.needs_feeds),
            (_reduce_precision, s.onnx_precision != "fp32"),
            (_build_engines, s.trt),
            (_gate_parity, True))


def export_bundle(checkpoint: str | os.PathLike, settings: ExportSettings, progress: bool = True) -> ExportResult:
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():  # it says what in the bundle TensorRT cannot build before asking for tensorrt
        return rebuild_engines(checkpoint, settings, progress)
    _require_engine(settings)
    out = Path(settings.out) if settings.out else default_out(checkpoint, settings)
    check_writable(out, settings.force, "" if settings.out else " (the default beside the checkpoint; choose one with --out DIR)")
    ckpt, spec, inputs = _load_model(checkpoint, settings)
    graphs = spec.graphs()
    steps = len(graphs) * (2 if settings.format.name == "trt" else 1) + 2
    with atomic_dir(out, BUNDLE, force=settings.force) as tmp, _progress(steps, progress) as bar:
        state = ExportState(checkpoint, settings, ckpt, spec, inputs, graphs, tmp, bar, out=out, progress=progress)
        for step, taken in _steps(state):
            if taken:
                step(state)
                # on disk after every step: the later steps load the bundle made so far
                state.manifest.write(tmp)
        bar.update()
    return ExportResult(out, state.manifest, defaulted=not settings.out)
