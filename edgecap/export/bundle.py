"""Write a bundle directory: graphs, (engines), manifest.json, parity report — all or nothing.

Everything is written into a temporary directory beside the target and renamed onto it only
after the parity gate passed (`edgecap.io.atomic_dir`), so a failed or interrupted export
leaves no partial bundle; an existing bundle is replaced only with --force, and nothing that
is not an edgecap bundle is ever replaced.
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from edgecap.contract.manifest import (
    FORMAT_VERSION,
    DecodingDefaults,
    DecodingState,
    GraphEntry,
    Manifest,
    Vocabulary,
)
from edgecap.errors import EdgecapError, require
from edgecap.export.formats import ExportSettings
from edgecap.export.rebuild import rebuild_engines
from edgecap.export.result import ExportResult
from edgecap.io import BUNDLE, atomic_dir, check_replaceable, probe_writable, sha256_file

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


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("edgecap", "torch", "onnx", "onnxruntime", "onnxscript", "tensorrt"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def _progress(total: int, enabled: bool):
    from edgecap.progress import progress_bar

    return progress_bar(total=total, desc="export", unit="step", leave=False, quiet=not enabled)


def _check(path: Path, checks: dict, trt: bool, ranges: dict | None = None, run_polygraphy: bool = False) -> None:
    """Record in the manifest's `checks` what TensorRT would make of the graph at `path`; when
    building engines, refuse a graph it cannot build."""
    from edgecap.export import compat

    report = compat.check_file(path, ranges, run_polygraphy=run_polygraphy)
    checks[path.name] = {"tensorrt_compatible": report.ok, "problems": report.problems}
    if trt:
        compat.require_compatible([report])


def export_bundle(checkpoint: str | os.PathLike, settings: ExportSettings, progress: bool = True) -> ExportResult:
    checkpoint = Path(checkpoint)
    fmt = settings.format
    if checkpoint.is_dir():  # it says what in the bundle TensorRT cannot build before asking for tensorrt
        return rebuild_engines(checkpoint, settings, progress)
    if fmt.name == "trt":  # a missing or unsupported TensorRT, said before any work
        from edgecap.export.tensorrt import require_int8_mode
        from edgecap.runtime.engines import tensorrt_module

        require_int8_mode(tensorrt_module("--engine trt"), settings.int8_mode if settings.precision == "int8" else "qdq")
    elif fmt.requires != "onnxruntime":
        require(fmt.requires, fmt.extra, f"--engine {fmt.name}")
    out = Path(settings.out) if settings.out else default_out(checkpoint, settings)
    check_writable(out, settings.force, "" if settings.out else " (the default beside the checkpoint; choose one with --out DIR)")

    require("torch", "train", "export")
    import torch

    # the native libraries, imported before the work directory exists: a SIGTERM raised while
    # one of them is importing crosses C++ (nanobind) and aborts the process, skipping cleanup
    require("onnx", "train", "ONNX export")
    require("onnxruntime", "train", "the parity gate")
    from edgecap.export.onnx import export_graph
    from edgecap.export.specs import spec_for
    from edgecap.export.verify import load_parity_inputs, parity_gate, require_parity
    from edgecap.models.checkpoint import check_finite, load_checkpoint
    from edgecap.runtime.session import Bundle

    torch.manual_seed(0)
    ckpt = load_checkpoint(checkpoint)
    if settings.frontend:
        from edgecap.export.attach import attach_frontend

        for note in attach_frontend(ckpt, settings.frontend, settings.visual_weights, settings.image_size):
            print(f"note: {note}", file=sys.stderr)
    check_finite(ckpt.model.state_dict(), f"checkpoint {checkpoint}", "a bundle of it would caption nothing "
                 "(train again, or export an earlier checkpoint)")
    cfg, vocab = ckpt.config, ckpt.vocab
    spec = spec_for(ckpt.model, settings.batch, settings.beam)
    inputs = load_parity_inputs(spec, settings.samples, settings.data, ckpt.meta, checkpoint=checkpoint)
    graphs = spec.graphs()
    trt = fmt.name == "trt"
    steps = len(graphs) * (2 if trt else 1) + 2
    with atomic_dir(out, BUNDLE, force=settings.force) as tmp, _progress(steps, progress) as bar:
        # 1. fp32 ONNX graphs, checked for static shapes and TensorRT-compatible ops
        infos, checks = {}, {}
        ranges = {"token": (0, cfg.vocab_size - 1), "step": (0, cfg.max_len - 1)}
        for g in graphs:
            bar.set_postfix_str(f"onnx {g.role}")
            infos[g.role] = export_graph(g, tmp / f"{g.role}.onnx", settings.opset, settings.exporter)
            _check(tmp / f"{g.role}.onnx", checks, trt, ranges, run_polygraphy=trt)
            bar.update()
        manifest = Manifest(
            format_version=FORMAT_VERSION,
            created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            model={"name": cfg.name, "family": cfg.family, "decoder": cfg.decoder, "config": cfg.to_dict(),
                   "parameters": ckpt.model.num_parameters(), "checkpoint": checkpoint.name},
            input="images" if spec.takes_images else "features",
            batch_size=settings.batch, beam_size=settings.beam, max_len=cfg.max_len,
            vocab=Vocabulary(list(vocab.itos), vocab.pad_id, vocab.bos_id, vocab.eos_id, vocab.unk_id),
            preprocessing=spec.preprocessing(),
            frontend=spec.frontend(),
            decoding=DecodingDefaults(beam_size=settings.beam, max_len=cfg.max_len, length_penalty=0.0),
            state=DecodingState.of(ckpt.model.state, spec.top_k, spec.extra_names),
            graphs=[GraphEntry.of_file(g.role, f"{g.role}.onnx", tmp, "onnxruntime", "fp32", **infos[g.role])
                    for g in graphs],
            checks=checks,
            target=settings.target,
            versions=versions(),
        )
        retrieval = spec.assets(tmp, vocab)
        if retrieval:
            manifest.retrieval = {**retrieval, "sha256": {retrieval[k]: sha256_file(tmp / retrieval[k])
                                                          for k in ("index", "tokens")}}
        manifest.write(tmp)
        np_batches = [tuple(x.numpy() for x in b) for b in inputs.batches]
        if settings.calibration:  # said before the slow work: a folder that would go unused
            from edgecap.export.front_int8 import check_calibration

            check_calibration(settings.calibration, tmp / "visual.onnx")

        # 2. reduced precision: ONNX graphs rewritten in place. TensorRT builds strongly typed
        # engines from them at their own precision; only its calibrator builds int8 from fp32
        calibrated = trt and settings.precision == "int8" and settings.int8_mode == "calibrator"
        onnx_precision = "fp32" if calibrated else settings.precision
        onnx_quantize = "static" if trt else settings.quantize  # TensorRT builds int8 from static QDQ
        feeds = None
        needs_feeds = (onnx_precision == "int8" and onnx_quantize == "static") or calibrated
        if needs_feeds:
            bar.set_postfix_str("calibration inputs")
            from edgecap.export.calibration import record_feeds

            feeds = record_feeds(Bundle.load(tmp, providers=["CPUExecutionProvider"], engine="onnxruntime"), np_batches)
        front_int8 = None  # the static-int8 front end's record (edgecap.export.front_int8)
        if onnx_precision != "fp32":
            from edgecap.export.quantize import (
                convert_fp16,
                graph_mode,
                is_convolutional,
                quantize_int8,
            )

            for entry in manifest.graphs:
                path = tmp / entry.file
                bar.set_postfix_str(f"{onnx_precision} {entry.role}")
                if entry.role == "visual" and onnx_precision == "int8" and not trt and is_convolutional(path):
                    from edgecap.export.front_int8 import quantize_visual

                    front_int8 = quantize_visual(path, spec, settings.calibration, inputs, np_batches, ckpt.meta,
                                                 settings.beam)
                    entry.precision = front_int8["precision"]
                elif onnx_precision == "fp16":
                    entry.precision = convert_fp16(path, path)
                else:
                    entry.precision = quantize_int8(path, path, graph_mode(onnx_quantize, entry.role),
                                                    (feeds or {}).get(entry.role))
                entry.sha256 = sha256_file(path)
                # the checks describe the graph the bundle holds: dynamic int8's integer MatMuls
                # and weight-only's contrib ops are not TensorRT's
                _check(path, checks, trt)
        # 3. TensorRT engines beside their ONNX source
        if trt:
            from edgecap.export.tensorrt import build_engine, engine_name

            cache = Path(settings.timing_cache) if settings.timing_cache else None
            for entry in list(manifest.graphs):
                bar.set_postfix_str(f"tensorrt {entry.role}")
                rows = settings.batch * (settings.beam if entry.role == "decoder_step" else 1)
                name = engine_name(entry.role, rows, settings.precision)
                info = build_engine(tmp / entry.file, tmp / name, settings.precision, settings.workspace, cache,
                                    settings.int8_mode, (feeds or {}).get(entry.role))
                manifest.graphs.append(GraphEntry.of_file(entry.role, name, tmp, "tensorrt", settings.precision,
                                                          entry.inputs, entry.outputs, entry.opset,
                                                          source=entry.file, tensorrt=info))
                bar.update()
        manifest.write(tmp)

        # 4. the parity gate, on every engine the bundle carries
        parity = {}
        engines = ["onnxruntime"] + (["tensorrt"] if trt else [])
        for engine in engines:
            bar.set_postfix_str(f"parity {engine}")
            bundle = Bundle.load(tmp, providers=["CPUExecutionProvider"], engine=engine)
            precision = settings.precision if engine == "tensorrt" else onnx_precision
            parity[engine] = parity_gate(spec, bundle, inputs, precision, vocab)
            if precision == "int8":  # which int8: onnxruntime's quantization or TensorRT's int8 mode
                parity[engine]["quantize"] = settings.int8_mode if engine == "tensorrt" else onnx_quantize
            if front_int8 is not None and engine == "onnxruntime":
                parity[engine]["front_end_int8"] = front_int8
            require_parity(parity[engine])
            bar.update()
        manifest.parity = parity
        manifest.write(tmp)
        bar.update()
    return ExportResult(out, manifest, defaulted=not settings.out)
