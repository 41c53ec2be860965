"""Static int8 for a convolutional front end, kept only where it pays.

Dynamic int8 rewrites MatMul / Gemm only, so a CNN front end (resnet50, RN50, mobilenet, the
demo's small CNN) would stay fp32 in an int8 bundle. Here its visual graph is quantised as
static QDQ (`quantize.quantize_front_end`), calibrated on the user's images (`--calibration
DIR`) or on frames of the synthetic world, then measured against the fp32 graph on other
images, on this machine, before the bundle is written:

- time: median of a few runs of each graph (onnxruntime CPU, the export's threads);
- feature cosine against fp32 (per feature vector, averaged), and centred on the mean feature
  of the evaluation images (what tells the images apart; see `verify.feature_cosine`);
- caption agreement: the share of images whose PyTorch beam caption is the same on the int8
  features as on the fp32 ones, when the captioner is trained (a checkpoint from `edgecap
  train`) and the parity inputs are its data; random weights caption noise, so none then.

int8 is kept when it is at least 10% faster, its feature cosine is at least 0.99 and, where
measured, its caption agreement at least 0.75; otherwise the graph stays fp32 and the reason
is recorded. The record goes into the manifest's parity report (`front_end_int8`).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError

FASTER_BY = 0.9  # int8 must take at most this share of fp32's time
COSINE_FLOOR = 0.99
AGREEMENT_FLOOR = 0.75
CALIBRATION_IMAGES = 16
EVALUATION_IMAGES = 8
TIMED_RUNS = 5


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _median_ms(session, feed: dict) -> float:
    session.run(None, feed)  # warm-up: the first run allocates
    seconds = []
    for _ in range(TIMED_RUNS):
        start = time.perf_counter()
        session.run(None, feed)
        seconds.append(time.perf_counter() - start)
    return 1e3 * statistics.median(seconds)


def evaluation_images(spec, inputs, batches: list[tuple]) -> tuple[list[np.ndarray], str]:
    """The parity inputs' images when they are the checkpoint's data, else synthetic-world
    frames of another seed than the calibration's."""
    from edgecap.export.calibration import EVALUATION_SEED, image_batches, world_frames

    if not inputs.random:
        return [b[0] for b in batches], inputs.source
    frames = world_frames(EVALUATION_IMAGES, EVALUATION_SEED)
    return (image_batches(frames, spec.preprocessing(), spec.batch),
            f"{EVALUATION_IMAGES} synthetic-world frames (seed {EVALUATION_SEED})")


def is_trained(meta: dict) -> bool:
    """A checkpoint `edgecap train` wrote (it records its config and step)."""
    return bool(meta.get("train_config") or meta.get("step"))


def quantize_visual(path: Path, spec, calibration: str, inputs, batches: list[tuple], meta: dict,
                    beam: int) -> dict:
    """Quantise the visual graph at `path` in place if int8 pays; -> the record of the choice."""
    from edgecap.export.calibration import calibration_images
    from edgecap.export.quantize import quantize_front_end
    from edgecap.export.verify import caption_agreement

    calib, calib_source = calibration_images(calibration, CALIBRATION_IMAGES, spec.preprocessing(), spec.batch)
    evaluation, eval_source = evaluation_images(spec, inputs, batches)
    candidate = path.with_name(f".{path.stem}.int8.onnx")
    try:
        quantize_front_end(path, candidate, calib)
        fp32, int8 = _session(path), _session(candidate)
        name = fp32.get_inputs()[0].name
        fp32_ms = _median_ms(fp32, {name: evaluation[0]})
        int8_ms = _median_ms(int8, {name: evaluation[0]})
        pairs, measured = compare_graphs(fp32, int8, evaluation)
        record = {
            "calibration": calib_source if calibration else f"{calib_source}; none named with --calibration",
            "evaluation": eval_source,
            "fp32_ms": round(fp32_ms, 3), "int8_ms": round(int8_ms, 3),
            **measured,
            "caption_agreement": None,
        }
        if is_trained(meta) and not inputs.random:
            record["caption_agreement"] = caption_agreement(spec.model, pairs, beam)
        reasons = []
        if int8_ms > FASTER_BY * fp32_ms:
            reasons.append(f"int8 took {int8_ms:.2f} ms against fp32's {fp32_ms:.2f} ms (more than "
                           f"{FASTER_BY:.0%} of it)")
        if record["feature_cosine"] < COSINE_FLOOR:
            reasons.append(f"feature cosine {record['feature_cosine']:.4f} < {COSINE_FLOOR}")
        agreement = record["caption_agreement"]
        if agreement is not None and agreement < AGREEMENT_FLOOR:
            reasons.append(f"captions agree on {agreement:.0%} of images < {AGREEMENT_FLOOR:.0%}")
        if reasons:
            record.update(precision="fp32", reason="kept fp32: " + "; ".join(reasons))
        else:
            del fp32, int8  # the sessions hold the files open on some platforms
            os.replace(candidate, path)
            record.update(precision="int8", reason=f"static int8: {fp32_ms / int8_ms:.1f}x faster, "
                                                   f"feature cosine {record['feature_cosine']:.4f}")
        return record
    finally:
        candidate.unlink(missing_ok=True)


def compare_graphs(fp32, int8, batches: list[np.ndarray], head: tuple | None = None) -> tuple[list[tuple], dict]:
    """The fp32 and int8 visual graphs (onnxruntime sessions) on the same preprocessed batches:
    -> ((feats, mask) of both per batch, {feature cosine plain and centred, how alike different
    images' fp32 features are, and with an ImageNet `head` (weight [classes, D], bias), the share
    of images whose top-1 class of the pooled features is the same, and each image's pair})."""
    from edgecap.export.verify import feature_cosine

    name = fp32.get_inputs()[0].name
    pairs = [(*fp32.run(None, {name: x}), *int8.run(None, {name: x})) for x in batches]
    feats_a = np.concatenate([p[0] for p in pairs])
    feats_b = np.concatenate([p[2] for p in pairs])
    measured = {
        "feature_cosine": feature_cosine(feats_a, feats_b),
        # both need two images or more (one image is its own mean): None with one
        "centred_feature_cosine": feature_cosine(feats_a, feats_b, centre=feats_a.mean(axis=0))
        if len(feats_a) > 1 else None,
        # how alike different images' fp32 features are: near 1, the features barely
        # depend on the image (random weights) and the plain cosine says little
        "cosine_between_images": feature_cosine(feats_a[:-1], feats_a[1:]) if len(feats_a) > 1 else None,
    }
    if head is not None:
        top_a, top_b = (top1(f, head) for f in (feats_a, feats_b))
        measured["top1_agreement"] = float(np.mean(top_a == top_b))
        measured["top1"] = [[int(a), int(b)] for a, b in zip(top_a, top_b, strict=True)]
    return pairs, measured


def top1(feats: np.ndarray, head: tuple) -> np.ndarray:
    """Each image's top-1 class: its grid [N, D] average-pooled through the classifier `head`."""
    weight, bias = head
    return (feats.mean(axis=1) @ weight.T + bias).argmax(axis=1)


def check_calibration(calibration: str, visual: Path) -> None:
    """`--calibration DIR` calibrates a convolutional front end: refused where none is."""
    from edgecap.export.quantize import is_convolutional

    if not visual.exists():
        raise EdgecapError(f"--calibration {calibration}: calibration images are for a bundle with a front end; "
                           f"this checkpoint reads precomputed features (attach one with --frontend NAME)")
    if not is_convolutional(visual):
        raise EdgecapError(f"--calibration {calibration}: calibrates a convolutional front end's static int8, and "
                           f"this bundle's front end is mostly linear layers, which dynamic int8 quantizes "
                           f"without calibration")
