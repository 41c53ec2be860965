"""Weight-only quantization of a bundle (onnxruntime's MatMulNBits) for `ort_settings.py --weight-only`:
the schemes measured, a bundle quantized as `--quantize weight-only` does with one of them (the
decoder step weight-only, the other graphs dynamic int8: `quantize.graph_mode`), and its
caption agreement with PyTorch fp32 on a trained checkpoint (the parity gate's greedy and beam
comparison).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.export.quantize import WeightOnly

# 8-bit: blocks of 32 / 128 input rows and the largest block onnxruntime quantizes (256; one
# scale per output column would need 512 and 2048 here), each with fp32 compute (accuracy
# level 0) and int8 compute (level 4); 4-bit as the smallest form
SCHEMES = (
    WeightOnly(8, 32, 0), WeightOnly(8, 128, 0), WeightOnly(8, 32, 4), WeightOnly(8, 128, 4), WeightOnly(8, 256, 4),
    WeightOnly(4, 32, 4), WeightOnly(4, 128, 4), WeightOnly(4, 128, 0),
)
QUICK_SCHEMES = (WeightOnly(8, 256, 4), WeightOnly(4, 32, 0))


def requantized(roots: dict[str, Path], out: Path, scheme: WeightOnly) -> Path:
    """The dynamic int8 bundle `roots["int8"]` copied to `out` with its decoder step replaced by
    the fp32 bundle's (`roots["fp32"]`) quantized with `scheme`, as `--quantize weight-only` exports."""
    from edgecap.contract.manifest import load_manifest
    from edgecap.export.quantize import quantize_weight_only
    from edgecap.io import sha256_file

    shutil.copytree(roots["int8"], out)
    manifest = load_manifest(out)
    entry = manifest.graph("decoder_step")
    # a 4-bit step keeps the entry's "int8": the manifest knows no int4, and only these timings read it
    quantize_weight_only(roots["fp32"] / entry.file, out / entry.file, scheme)
    entry.sha256 = sha256_file(out / entry.file)
    manifest.write(out)
    return out


def encoder_graphs(roots: dict[str, Path], scratch: Path, scheme: WeightOnly) -> dict[str, Path]:
    """The encoder graph as fp32, dynamic int8 and `scheme`: why weight-only stops at the step."""
    from edgecap.export.quantize import quantize_weight_only

    weight_only = scratch / f"encoder.{scheme.name}.onnx"
    quantize_weight_only(roots["fp32"] / "encoder.onnx", weight_only, scheme)
    return {"fp32": roots["fp32"] / "encoder.onnx", "dynamic int8": roots["int8"] / "encoder.onnx",
            scheme.name: weight_only}


def bundle_mb(root: Path) -> float:
    return sum(p.stat().st_size for p in root.glob("*.onnx")) / 1e6


def agreement(checkpoint: Path, schemes, samples: int, beam: int, workdir: Path) -> dict:
    """{variant: parity report (greedy / beam identical, CIDEr-D delta) and bundle MB} for the fp32
    bundle of `checkpoint`, its dynamic int8 bundle and each weight-only scheme, all on the same
    parity inputs (the checkpoint's data or fresh scenes of its world)."""
    from edgecap.export.bundle import export_bundle
    from edgecap.export.formats import resolve_settings
    from edgecap.export.specs import spec_for
    from edgecap.export.verify import load_parity_inputs, parity_gate
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.runtime.session import Bundle

    ckpt = load_checkpoint(checkpoint)
    spec = spec_for(ckpt.model, 1, beam)
    inputs = load_parity_inputs(spec, samples, "", ckpt.meta, checkpoint=checkpoint)
    exported = {}
    for precision in ("fp32", "int8"):
        settings = resolve_settings({"engine": "onnx", "batch": 1, "beam": beam, "precision": precision,
                                     "samples": 1, "out": str(workdir / f"agreement-{precision}")})
        exported[precision] = export_bundle(checkpoint, settings, progress=False).path
    roots = {"fp32": exported["fp32"], "dynamic int8": exported["int8"]}
    out = {}
    for scheme in schemes:
        try:
            roots[scheme.name] = requantized(exported, workdir / f"agreement-{scheme.name}", scheme)
        except EdgecapError as exc:
            out[scheme.name] = {"failed": str(exc)}
    for name, root in roots.items():
        bundle = Bundle.load(root, providers=["CPUExecutionProvider"], engine="onnxruntime")
        report = parity_gate(spec, bundle, inputs, "fp32" if name == "fp32" else "int8", ckpt.vocab)
        out[name] = {k: report[k] for k in ("inputs", "samples", "greedy_identical", "beam_identical", "cider_delta")}
        out[name]["bundle_mb"] = bundle_mb(root)
    return out
