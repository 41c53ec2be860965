"""COCO caption metrics through pycocoevalcap: BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE.

References come from a Karpathy-split `dataset_coco.json` or a COCO captions file
(`captions_val2014.json`, what the official coco-caption evaluator reads); candidates and references both go
through pycocoevalcap's PTB tokenizer (Java), as on the COCO evaluation server. CIDEr-D here
is pycocoevalcap's `Cider` (document frequencies from the evaluated split's references), the
number papers report. SPICE is run only when asked; it needs Stanford CoreNLP 3.6.0 jars that
pycocoevalcap downloads on first use, so offline it is reported as unavailable with the reason.
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

from edgecap.data.karpathy import FOLD
from edgecap.errors import EdgecapError, require
from edgecap.io import stderr_lines
from edgecap.jsonio import read_json

BLEU = ("BLEU-1", "BLEU-2", "BLEU-3", "BLEU-4")


class References(dict):
    """{key: [raw reference sentences]} and `scope`, the part of the file they are, for messages."""

    def __init__(self, refs: dict[str, list[str]], scope: str):
        super().__init__(refs)
        self.scope = scope


def load_references(path: str | Path, split: str | None = None) -> tuple[References, object]:
    """({key: [raw reference sentences]}, resolve) from a Karpathy dataset_coco.json or a COCO
    captions file (captions_val2014.json, the official evaluator's annotation file).

    key is str(cocoid) (or str(imgid) when there is no cocoid) / str(image_id); `resolve(image_id)`
    maps a prediction's image id (that number, the file name, or its stem) to the key. `split`
    picks a Karpathy split (default "test"); a COCO captions file has none, so every image it
    annotates is a reference and naming a split is an error.
    """
    path = Path(path)
    data = read_json(path, "references")
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        if split is not None:
            raise EdgecapError(f"{path}: a COCO captions file has no splits (split {split!r} asked); "
                               "every image it annotates is a reference: drop --split")
        refs, aliases = _coco_captions(path, data)
        refs = References(refs, str(path))
    else:
        split = split or "test"
        refs, aliases = _karpathy_references(path, data, split)
        refs = References(refs, f"split {split!r} of {path}")

    return refs, id_resolver(refs, aliases)


def id_resolver(keys, aliases: dict[str, str]):
    """image_id -> key: the key itself, a zero-padded number ("000000391895", a COCO 2017
    file stem), or a file name / stem in `aliases`; anything else is returned as it is."""

    def resolve(image_id) -> str:
        text = str(image_id).strip()
        if text in keys:
            return text
        if text.isdigit() and str(int(text)) in keys:
            return str(int(text))
        return aliases.get(text, aliases.get(Path(text).name, text))

    return resolve


def file_aliases(name, key: str, aliases: dict[str, str]) -> None:
    """Record an image's file name and its stem as aliases of its key."""
    for alias in (name, Path(str(name or "")).stem):
        if alias:
            aliases.setdefault(str(alias), key)


def _karpathy_references(path: Path, data, split: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    images = data.get("images") if isinstance(data, dict) else None
    if not isinstance(images, list):
        raise EdgecapError(f"{path}: expected a Karpathy dataset JSON with an 'images' list "
                           "or a COCO captions JSON with 'annotations'")
    refs: dict[str, list[str]] = {}
    aliases: dict[str, str] = {}
    splits = set()
    for i, img in enumerate(images):
        if not isinstance(img, dict):
            raise EdgecapError(f"{path}: images[{i}] is not an object")
        splits.add(img.get("split"))
        if img.get("split") != split and FOLD.get(img.get("split")) != split:  # train takes restval
            continue
        ident = img.get("cocoid", img.get("imgid"))
        if ident is None:
            raise EdgecapError(f"{path}: images[{i}] has neither 'cocoid' nor 'imgid'")
        sents = img.get("sentences")
        if not isinstance(sents, list) or not sents:
            raise EdgecapError(f"{path}: images[{i}] ('{ident}') has no 'sentences'")
        texts = []
        for j, s in enumerate(sents):
            text = s.get("raw") if isinstance(s, dict) else None
            if not isinstance(text, str):
                tokens = s.get("tokens") if isinstance(s, dict) else None
                if not isinstance(tokens, list):
                    raise EdgecapError(f"{path}: images[{i}].sentences[{j}] has no 'raw' or 'tokens'")
                text = " ".join(map(str, tokens))
            texts.append(text)
        key = str(ident)
        refs[key] = texts
        file_aliases(img.get("filename"), key, aliases)
    if not refs and splits <= {None}:  # image_info_test2014.json: images, no captions, no splits
        raise EdgecapError(f"{path}: its images have no 'split' and it has no 'annotations': neither a "
                           "Karpathy dataset JSON nor a COCO captions file, so no reference captions")
    if not refs:
        raise EdgecapError(
            f"{path}: no images in split {split!r}; splits present: "
            f"{', '.join(sorted(str(s) for s in splits))}"
        )
    return refs, aliases


def _coco_captions(path: Path, data: dict) -> tuple[dict[str, list[str]], dict[str, str]]:
    refs: dict[str, list[str]] = {}
    for i, ann in enumerate(data["annotations"]):
        if not isinstance(ann, dict) or "image_id" not in ann or not isinstance(ann.get("caption"), str):
            raise EdgecapError(f"{path}: annotations[{i}] needs 'image_id' and a 'caption' string "
                               "(a COCO captions file, like captions_val2014.json)")
        refs.setdefault(str(ann["image_id"]), []).append(ann["caption"])
    if not refs:
        raise EdgecapError(f"{path}: a COCO captions file without annotations")
    aliases: dict[str, str] = {}
    for img in data.get("images") or []:
        if isinstance(img, dict) and str(img.get("id")) in refs:
            file_aliases(img.get("file_name"), str(img["id"]), aliases)
    return refs, aliases


def _check_java() -> None:
    if shutil.which("java") is None:
        raise EdgecapError("java not found: the PTB tokenizer and METEOR/SPICE need a Java runtime")


def tokenize(texts: dict[str, list[str]]) -> dict[str, list[str]]:
    """PTB-tokenise {key: [sentences]} (lower-cased, punctuation dropped)."""
    ptb = require("pycocoevalcap.tokenizer.ptbtokenizer", "eval", "COCO caption metrics")
    _check_java()
    # The tokenizer preserves one output line per input line; a caption with a newline would
    # shift every later one, so flatten them first.
    flat = {k: [{"caption": " ".join(s.split())} for s in v] for k, v in texts.items()}
    # the JVM inherits our stderr and reports "PTBTokenizer tokenized N tokens at ..." on every
    # call: keep that off the console, and read it for a Java failure instead
    with stderr_lines() as java_stderr:
        out = ptb.PTBTokenizer().tokenize(flat)
    failure = [line for line in java_stderr if "Exception" in line or "Error" in line]
    if failure:
        raise EdgecapError(f"the PTB tokenizer (Java) failed: {failure[0].strip()[:300]}")
    # trailing empty captions produce no output line at all: restore them as empty strings
    return {k: out.get(k, [""] * len(v))[: len(v)] + [""] * (len(v) - len(out.get(k, [])))
            for k, v in texts.items()}


def spice_status() -> str | None:
    """None when SPICE can run; else why not."""
    try:
        import pycocoevalcap.spice as spice_pkg
    except ImportError:
        return "pycocoevalcap is not installed"
    lib = Path(spice_pkg.__file__).parent / "lib"
    missing = [n for n in ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")
               if not (lib / n).is_file()]
    if missing:
        return (f"SPICE needs {', '.join(missing)} in {lib}; pycocoevalcap downloads them on first "
                "use and this run is offline")
    if shutil.which("java") is None:
        return "java not found"
    return None


def _scorers(meteor: bool):
    bleu = require("pycocoevalcap.bleu.bleu", "eval", "BLEU")
    rouge = require("pycocoevalcap.rouge.rouge", "eval", "ROUGE-L")
    cider = require("pycocoevalcap.cider.cider", "eval", "CIDEr-D")
    out = [(BLEU, bleu.Bleu(4)), (("ROUGE-L",), rouge.Rouge()), (("CIDEr-D",), cider.Cider())]
    if meteor:
        mod = require("pycocoevalcap.meteor.meteor", "eval", "METEOR")
        out.insert(1, (("METEOR",), mod.Meteor()))
    return out


def evaluate(predictions: dict[str, str], references: dict[str, list[str]],
             meteor: bool = True, spice: bool = False) -> dict:
    """Corpus and per-image scores for the images present in both inputs.

    Returns {"overall": {metric: value}, "per_image": {key: {metric: value}},
    "unavailable": {metric: reason}, "n_images": int}.
    """
    keys = [k for k in predictions if k in references]
    if not keys:
        raise EdgecapError("no prediction matches an image of the reference split")
    res = tokenize({k: [predictions[k]] for k in keys})
    gts = tokenize({k: references[k] for k in keys})
    overall: dict[str, float] = {}
    per_image: dict[str, dict[str, float]] = {k: {} for k in keys}
    unavailable: dict[str, str] = {}
    for names, scorer in _scorers(meteor):
        with contextlib.redirect_stdout(io.StringIO()):  # BLEU prints its internals
            score, scores = scorer.compute_score(gts, res)
        if len(names) == 1:
            score, scores = [score], [scores]
        for name, s, per in zip(names, score, scores, strict=False):
            overall[name] = float(s)
            for k, v in zip(keys, per, strict=False):
                per_image[k][name] = float(v)
        if hasattr(scorer, "meteor_p"):  # stop METEOR's JVM now, not at interpreter exit
            scorer.meteor_p.stdin.close()
            scorer.meteor_p.kill()
            scorer.meteor_p.wait()
            scorer.meteor_p = _Closed()
    if spice:
        reason = spice_status()
        if reason is None:
            try:
                from pycocoevalcap.spice.spice import Spice

                score, scores = Spice().compute_score(gts, res)
                overall["SPICE"] = float(score)
                for k, v in zip(sorted(keys), scores, strict=False):
                    per_image[k]["SPICE"] = float(v["All"]["f"])
            except Exception as exc:  # SPICE's JVM failing must not lose the other metrics
                reason = f"SPICE failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if reason is not None:
            unavailable["SPICE"] = reason
    return {"overall": overall, "per_image": per_image, "unavailable": unavailable,
            "n_images": len(keys)}


class _Closed:
    """Stands in for METEOR's finished process so its __del__ has nothing left to kill."""

    class _Pipe:
        def close(self):
            pass

    stdin = _Pipe()

    def kill(self):
        pass

    def wait(self):
        pass
