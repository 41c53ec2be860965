"""Package a finished synthetic-world run as the demo model, with its measured numbers.

    python -m edgecap.train.demo runs/demo-tabletop            # -> edgecap/assets/demo-smart.*
    python -m edgecap.train.demo --rescore runs/demo-tabletop/data   # the packaged asset, again

Reads the run's `best_xe.pt` (end of XE), `last.pt` (end of SCST) and `best.pt`, captions the
world's val and test splits with each, and writes

    demo-smart.pt            best.pt's weights in fp16 (what `make demo` exports and runs)
    demo-smart.metrics.json  CIDEr-D (val and test, greedy and beam) for XE and after SCST,
                             object coverage against the world's ground truth (objects.json;
                             box areas, "area > threshold", as `edgecap eval coverage`),
                             sample captions, training time and settings

`--rescore WORLD` measures the packaged asset itself again on the world it was trained on
(CIDEr-D and coverage, into the metrics file's `asset` entry) without touching the weights:
for when the metric changes after the run's other checkpoints are gone. Each entry names the
coverage rule it was measured with (`coverage_rule`).

CIDEr-D document frequencies come from the references of the split being scored, as the
COCO evaluation does. Coverage needs the `nlp` extra (spaCy + GloVe); without it the metrics
file says so instead of holding numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.objects import object_area
from edgecap.data.datasets import ImageSource
from edgecap.data.karpathy import KarpathyImage, load_karpathy
from edgecap.errors import EdgecapError, MissingExtraError
from edgecap.io import write_json_atomic
from edgecap.jsonio import read_json
from edgecap.metrics.ciderd import CiderD
from edgecap.metrics.coverage import CoverageScorer, summarize
from edgecap.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from edgecap.train.captioning import caption_batch, extra_inputs_for
from edgecap.train.metrics_log import MetricsLog

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def caption_images(ck: Checkpoint, images: list[KarpathyImage], root: Path, beam_size: int = 1,
                   batch_size: int = 50) -> list[str]:
    source = ImageSource(root, ck.model.cfg.visual)
    extra_inputs = extra_inputs_for(ck)
    options = DecodeOptions(beam_size=beam_size, max_len=ck.model.cfg.max_len)
    out = []
    for i in range(0, len(images), batch_size):
        x = torch.stack([source.load(im, None)[0] for im in images[i : i + batch_size]])
        out += caption_batch(ck, x, options, extra_inputs)
    return out


COVERAGE_AREA = "box"  # the default of `edgecap eval coverage` and `edgecap run` (docs/coverage.md)
COVERAGE_RULE = f"{COVERAGE_AREA} area > threshold"
# Entries measured before coverage took box areas and "> t" carry no rule of their own.
EARLIER_RULE = ("pixels area >= threshold (the rule when this entry was measured; its checkpoint "
                "was not kept, so it cannot be measured again)")


def ground_truth(objects: dict, image_id: str, size: int, area: str = COVERAGE_AREA) -> dict[str, float]:
    """{class: largest instance area fraction} of one size x size image of objects.json, the
    area measured as `area` says (its box by default; objects.json's `area` is the pixel count's)."""
    gt: dict[str, float] = {}
    for obj in objects[image_id]:
        gt[obj["class"]] = max(gt.get(obj["class"], 0.0), object_area(obj["box"], obj["area"], size, size, area))
    return gt


def evaluate(ck: Checkpoint, data: Path, splits=("val", "test"), beams=(1, 3), scorer=None) -> dict:
    karpathy = load_karpathy(data / "dataset_coco.json", data / "images", splits=splits)
    objects = read_json(data / "objects.json")
    size = int(read_json(data / "synth.json")["size"])
    result: dict = {}
    for split in splits:
        images = karpathy[split]
        refs = [im.caption_strings() for im in images]
        cider = CiderD(refs)
        entry: dict = {"images": len(images)}
        for k in beams:
            captions = caption_images(ck, images, data / "images", beam_size=k)
            name = "greedy" if k == 1 else f"beam{k}"
            entry[f"cider_d_{name}"] = round(cider.score(captions, refs)[0], 4)
            if k == beams[-1]:
                entry["samples"] = [{"image_id": im.image_id, "caption": c, "reference": r[0]}
                                    for im, c, r in zip(images[:8], captions[:8], refs[:8], strict=False)]
                if scorer is not None:
                    gts = [ground_truth(objects, im.image_id, size) for im in images]
                    summary = summarize(scorer.score(captions, gts))
                    entry[f"coverage_{name}"] = {label: None if v["mean"] is None else round(v["mean"], 4)
                                                 for label, v in summary["thresholds"].items()}
                    entry["coverage_rule"] = COVERAGE_RULE
        result[split] = entry
    return result


def package(run: Path, out_dir: Path = ASSETS, name: str = "demo-smart", coverage: bool = True) -> dict:
    from edgecap.train.overrides import load_config

    run = Path(run)
    for f in ("best_xe.pt", "last.pt", "best.pt", "summary.json", "config.toml"):
        if not (run / f).is_file():
            raise EdgecapError(f"{run} lacks {f}: train the demo config to the end first")
    summary = read_json(run / "summary.json")
    if not summary.get("done"):
        raise EdgecapError(f"{run}: the run has not finished (summary.json done=false)")
    cfg = load_config(run / "config.toml")
    if cfg.data.synth is None:
        raise EdgecapError(f"{run} was not trained on the synthetic world ([data.synth]); nothing to package")
    data = Path(cfg.data.synth.dir) if cfg.data.synth.dir else run / "data"
    scorer, coverage_note = None, "not measured (coverage=False)"
    if coverage:
        try:
            scorer = CoverageScorer()
            coverage_note = ("SMArT object coverage (spaCy nouns, GloVe 6B-50d, clipped cosine) of the "
                             "beam-3 captions vs the world's objects.json, per area threshold: a class "
                             f"counts when its largest instance's {COVERAGE_AREA} area is > the threshold")
        except MissingExtraError as exc:
            scorer, coverage_note = None, f"not measured: {exc}"
    records = MetricsLog(run / "metrics.jsonl", enabled=False).records()
    vals = [r for r in records if r["kind"] == "val"]
    metrics: dict = {
        "model": summary["model"],
        "parameters": summary["parameters"],
        "config": cfg.source,
        "train_seconds": summary.get("train_seconds"),
        "steps": summary["step"],
        "coverage": coverage_note,
        "training_curve": [{"phase": r["phase"], "epoch": r["epoch"], "val_cider_d_greedy": round(r["cider_d"], 4)}
                           for r in vals],
    }
    start = time.perf_counter()
    for label, f in (("xe", "best_xe.pt"), ("scst", "last.pt")):
        metrics[label] = {"checkpoint": f, **evaluate(load_checkpoint(run / f), data, scorer=scorer)}
    best = load_checkpoint(run / "best.pt")
    metrics["asset"] = {"from": "best.pt", "phase": best.meta.get("phase"),
                        "val_cider_d_greedy": round(float(best.meta.get("val_cider_d", 0.0)), 4)}
    metrics["eval_seconds"] = round(time.perf_counter() - start, 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    # train_config names the world it was trained on: export's parity gate regenerates scenes of it
    save_checkpoint(out_dir / f"{name}.pt", best.model, best.vocab,
                    {"source": Path(cfg.source).name, "phase": best.meta.get("phase"),
                     "val_cider_d": best.meta.get("val_cider_d"), "step": best.meta.get("step"),
                     "train_config": cfg.to_dict()}, half=True)
    write_json_atomic(out_dir / f"{name}.metrics.json", metrics)
    return metrics


def rescore(data: Path, out_dir: Path = ASSETS, name: str = "demo-smart") -> dict:
    """Measure the packaged asset again on `data`, the world it was trained on, into the
    metrics file's `asset` entry; the weights are not rewritten."""
    from edgecap.data.synth.dataset import is_world_of

    asset, metrics_path = out_dir / f"{name}.pt", out_dir / f"{name}.metrics.json"
    for f in (asset, metrics_path):
        if not f.is_file():
            raise EdgecapError(f"{f} does not exist: package a finished run first")
    ck = load_checkpoint(asset)
    synth = ((ck.meta.get("train_config") or {}).get("data") or {}).get("synth")
    if not synth:
        raise EdgecapError(f"{asset} does not name the synthetic world it was trained on (meta train_config)")
    data = Path(data)
    if not is_world_of(data, synth, ("seed", "size", "image_format", "images")):
        raise EdgecapError(
            f"{data} is not the world {asset.name} was trained on; make it with: edgecap data synth --out "
            f"{data} --images {synth['images']} --seed {synth['seed']} --size {synth['size']} "
            f"--format {synth['image_format']}")
    metrics = read_json(metrics_path)
    start = time.perf_counter()
    measured = evaluate(ck, data, scorer=CoverageScorer())
    metrics["asset"] = {**metrics.get("asset", {}), **measured,
                        "eval_seconds": round(time.perf_counter() - start, 1)}
    for phase in ("xe", "scst"):
        for entry in (metrics.get(phase) or {}).values():
            if isinstance(entry, dict) and "coverage_beam3" in entry:
                entry.setdefault("coverage_rule", EARLIER_RULE)
    metrics["coverage"] = (f"SMArT object coverage (spaCy nouns, GloVe 6B-50d, clipped cosine) of the beam-3 "
                           f"captions vs the world's objects.json, per area threshold; each entry's "
                           f"coverage_rule says how an object's area was measured ({COVERAGE_RULE} now)")
    write_json_atomic(metrics_path, metrics)
    return metrics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgecap.train.demo", description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="finished run directory of configs/demo-tabletop.toml")
    parser.add_argument("--rescore", metavar="WORLD", default=None,
                        help="measure the packaged asset again on WORLD, its training world (no run needed)")
    parser.add_argument("--out", default=str(ASSETS), help="asset directory (default: edgecap/assets)")
    parser.add_argument("--name", default="demo-smart")
    parser.add_argument("--no-coverage", action="store_true", help="skip object coverage (no spaCy / GloVe)")
    args = parser.parse_args(argv)
    if (args.run is None) == (args.rescore is None):
        parser.error("give a finished run directory, or --rescore WORLD")
    try:
        if args.rescore is not None:
            metrics = rescore(Path(args.rescore), Path(args.out), args.name)
        else:
            metrics = package(Path(args.run), Path(args.out), args.name, coverage=not args.no_coverage)
    except EdgecapError as exc:
        print(f"edgecap.train.demo: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: metrics[k] for k in ("xe", "scst", "asset")}, indent=1)[:4000])
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
