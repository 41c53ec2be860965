"""CHAIR object hallucination (Rohrbach, Hendricks et al., EMNLP 2018).

`eval chair` finds object mentions with coverage's noun extraction (`Chair.read_nouns()`:
spaCy, class phrases then nouns, edgecap.metrics.nouns), so CHAIR and coverage agree on what a
caption names; every occurrence of a noun that names a class is a mention. With the paper's
synonyms file (and from Python without `read_nouns`), each caption is instead scanned for
object mentions the way the paper's code (`utils/chair.py` of
LisaAnne/Hallucination) does: lower-cased word tokens (an apostrophe splits a word, "man's" is
"man"; a hyphenated word stays one token, so "hot-dog" names nothing), plural forms reduced to a
known singular, then two-word names merged into one token (`DOUBLE_WORDS`: "hot dog" is not a
dog, "baby elephant" is an elephant and no person, "passenger train" a train, "train track"
and "home plate" name nothing, "toilet seat" is a toilet), a "seat" dropped from any caption
that also says "toilet", and every remaining word looked up in a synonym table. A mention is
hallucinated when its class is not among the image's ground-truth objects.

    CHAIR-i = hallucinated mentions / all mentions         (every occurrence counts)
    CHAIR-s = captions with >= 1 hallucinated mention / all captions

The built-in class vocabulary is the 80 COCO categories (the 30 ACVR classes are a subset) with
edgecap's synonyms (`edgecap.data.classes.NOUN_SYNONYMS` plus a short list for the other COCO
classes). The paper's numbers use its own, longer table (`data/synonyms.txt`: "man", "woman",
"rider" ... are persons; "glass", "plant", "dish" are not objects); `Chair.from_synonyms_file`
reads that file (`edgecap eval chair --synonyms`), and then mentions equal the paper's code's
except where its singulariser (pattern.en) mangles a word: it turns "bus" into "bu", "ties"
into "ty", "canoes" into "cano" and leaves "doggies" alone, so it never counts those; edgecap
does (docs/evaluation.md). That scan needs no spaCy: matching is a dictionary lookup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.data.classes import canonical_class
from edgecap.errors import EdgecapError
from edgecap.jsonio import read_json
from edgecap.metrics.coco import file_aliases, id_resolver
from edgecap.metrics.nouns import NounExtractor
from edgecap.metrics.vocabulary import COCO, COCO_EXTRA_SYNONYMS, ClassVocabulary

COCO_CLASSES: tuple[str, ...] = COCO.classes
__all__ = ["COCO_CLASSES", "COCO_EXTRA_SYNONYMS", "Chair", "ChairResult", "load_coco_instances", "summarize"]

# Two words read as one token before any lookup (the paper's code's rules): names of one
# object, qualifier + animal / vehicle pairs that must not fire the qualifier as a person
# ("baby elephant" -> elephant), and pairs that name no object ("train track", "home plate").
_NAMES = ("motor bike", "motor cycle", "air plane", "traffic light", "street light", "traffic signal",
          "stop light", "fire hydrant", "stop sign", "parking meter", "suit case", "sports ball",
          "baseball bat", "baseball glove", "tennis racket", "wine glass", "hot dog", "cell phone",
          "mobile phone", "teddy bear", "hair drier", "potted plant", "laptop computer",
          "home plate", "train track")
_ANIMALS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe",
            "animal", "cub")
DOUBLE_WORDS: dict[str, str] = {
    **{name: name for name in _NAMES},
    **{f"{qualifier} {animal}": animal for qualifier in ("baby", "adult") for animal in _ANIMALS},
    "passenger jet": "jet", "passenger train": "train",
    "bow tie": "tie", "toilet seat": "toilet",
}

_TOKEN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


# Irregular plurals captions use (the paper's code reduces them with pattern.en's singularize).
_IRREGULAR = {"people": "person", "children": "child", "geese": "goose", "mice": "mouse", "feet": "foot",
              "teeth": "tooth", "oxen": "ox", "dice": "die", "cacti": "cactus", "fungi": "fungus"}


def _singular_candidates(word: str) -> list[str]:
    """Possible singulars first, then the word itself ("glasses" -> "glass" before "glasses");
    only a candidate the vocabulary knows is used, so over-generating is harmless."""
    out = [_IRREGULAR[word]] if word in _IRREGULAR else []
    if word.endswith("men"):  # men, women, policemen
        out.append(word[:-3] + "man")
    if word.endswith("ies") and len(word) > 4:
        out.append(word[:-3] + "y")
    if word.endswith("ves"):
        out += [word[:-3] + "f", word[:-3] + "fe"]
    if word.endswith("es"):
        out.append(word[:-2])
    if word.endswith("s") and not word.endswith("ss"):
        out.append(word[:-1])
    return out + [word]


@dataclass
class ChairResult:
    caption: str
    mentions: list[tuple[str, str]]               # (words in the caption, class)
    hallucinated: list[tuple[str, str]]
    gt_objects: list[str]

    @property
    def chair_i(self) -> float:
        return len(self.hallucinated) / len(self.mentions) if self.mentions else 0.0

    def to_json(self) -> dict:
        return {"caption": self.caption, "mentions": [list(m) for m in self.mentions],
                "hallucinated": [list(m) for m in self.hallucinated],
                "gt_objects": self.gt_objects, "chair_i": self.chair_i,
                "chair_s": int(bool(self.hallucinated))}


@dataclass
class Chair:
    """Object-mention extraction and CHAIR scoring over a class vocabulary.

    `synonyms` extends the built-in tables; with `builtin=False` it replaces them (a table
    read from the paper's synonyms file). Mentions are found by scanning words as the paper's
    code does, or, after `read_nouns()`, as the nouns coverage reads (`NounExtractor`: class
    phrases, then nouns by their part of speech), each occurrence that names a class."""

    classes: tuple[str, ...] = COCO_CLASSES
    synonyms: dict[str, str] = field(default_factory=dict)
    builtin: bool = True
    extractor: object = None

    def __post_init__(self):
        self.vocabulary = ClassVocabulary.build(self.classes, "CHAIR", self.synonyms, self.builtin)
        table = self.vocabulary.names
        self.phrases = table
        # two-word table names merge like the paper's double words (no name is longer)
        self.double = {**{p: p for p in table if len(p.split()) == 2}, **DOUBLE_WORDS}
        self.words = {w for p in (*table, *self.double) for w in p.split()}

    def read_nouns(self, spacy_model: str | None = None) -> Chair:
        """Find mentions with coverage's noun extraction over this vocabulary (spaCy)."""
        self.extractor = NounExtractor(spacy_model, vocabulary=self.vocabulary)
        return self

    @classmethod
    def from_synonyms_file(cls, path) -> Chair:
        """The vocabulary of a synonyms file in the paper's format (data/synonyms.txt): one class
        per line, its name first, then its synonyms, separated by ", ". Entries are taken as
        the paper's code splits them, so one written after a double space (" motor bike") keeps
        its leading space and matches nothing there or here."""
        path = Path(path)
        try:
            lines = path.read_bytes().decode("utf-8").splitlines()
        except OSError as exc:
            raise EdgecapError(f"{path}: cannot read the synonyms file ({exc.strerror})") from None
        except UnicodeDecodeError as exc:
            raise EdgecapError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        rows = [line.strip().split(", ") for line in lines if line.strip()]
        if not rows:
            raise EdgecapError(f"{path}: no classes (expected lines 'class, synonym, synonym, ...')")
        table = {word: row[0] for row in rows for word in row}
        return cls(classes=tuple(dict.fromkeys(row[0] for row in rows)), synonyms=table, builtin=False)

    def _normalise(self, word: str) -> str:
        for cand in _singular_candidates(word):
            if cand in self.words:
                return cand
        return word

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """Object mentions in caption order as (matched words, class)."""
        return self.mentions_of([caption])[0]

    def mentions_of(self, captions: list[str]) -> list[list[tuple[str, str]]]:
        """`mentions` of many captions (the noun extraction batches them)."""
        if self.extractor is not None:
            return [[(noun, cls) for noun in nouns if (cls := self.vocabulary.class_of(noun)) is not None]
                    for nouns in self.extractor.mentions(captions)]
        return [self._scanned(c if isinstance(c, str) else "") for c in captions]

    def _scanned(self, caption: str) -> list[tuple[str, str]]:
        tokens = [self._normalise(t) for t in _TOKEN.findall(caption.lower())]
        merged: list[str] = []
        i = 0
        while i < len(tokens):
            pair = self.double.get(" ".join(tokens[i:i + 2])) if i + 1 < len(tokens) else None
            merged.append(pair if pair is not None else tokens[i])
            i += 2 if pair is not None else 1
        if "toilet" in merged and "seat" in merged:  # "the seat of the toilet" is no chair
            merged = [w for w in merged if w != "seat"]
        return [(w, self.phrases[w]) for w in merged if w in self.phrases]

    def score(self, caption: str, gt_objects) -> ChairResult:
        return self.score_all([caption], [gt_objects])[0]

    def score_all(self, captions: list[str], gt_objects: list) -> list[ChairResult]:
        out = []
        for caption, objects, mentions in zip(captions, gt_objects, self.mentions_of(captions), strict=True):
            gt = sorted(set(objects))
            out.append(ChairResult(caption, mentions, [m for m in mentions if m[1] not in gt], gt))
        return out


def summarize(results: list[ChairResult]) -> dict:
    """CHAIR-i and CHAIR-s over a caption set, with the counts they are made of."""
    mentions = sum(len(r.mentions) for r in results)
    halluc = sum(len(r.hallucinated) for r in results)
    caps_h = sum(1 for r in results if r.hallucinated)
    return {
        "CHAIR-i": halluc / mentions if mentions else 0.0,
        "CHAIR-s": caps_h / len(results) if results else 0.0,
        "captions": len(results),
        "captions_with_hallucination": caps_h,
        "captions_without_mentions": sum(1 for r in results if not r.mentions),
        "mentions": mentions,
        "hallucinated_mentions": halluc,
    }


def load_coco_instances(path, class_of=None) -> tuple[dict[str, set[str]], object]:
    """({str(image id): object classes}, resolve) from a COCO instances JSON (segmentation
    ground truth); `resolve` maps a caption's image_id (the id, zero-padded or not, the file
    name or its stem) to its key, as for `eval coco`. `class_of` names a category's class
    (default `canonical_class`; a synonyms file's table maps "tv" to its own class name)."""
    path = Path(path)
    data = read_json(path, "instances file")
    if not isinstance(data, dict) or not isinstance(data.get("categories"), list) \
            or not isinstance(data.get("annotations"), list):
        raise EdgecapError(f"{path}: expected COCO instances JSON with 'categories' and 'annotations'")
    class_of = class_of or canonical_class
    names = {}
    for cat in data["categories"]:
        try:
            names[cat["id"]] = class_of(cat["name"])
        except (TypeError, KeyError):
            raise EdgecapError(f"{path}: category {cat!r} needs 'id' and 'name'") from None
    images = [img for img in data.get("images", []) if isinstance(img, dict) and "id" in img]
    out: dict[str, set[str]] = {str(img["id"]): set() for img in images}
    aliases: dict[str, str] = {}
    for img in images:
        file_aliases(img.get("file_name"), str(img["id"]), aliases)
    for i, ann in enumerate(data["annotations"]):
        try:
            out.setdefault(str(ann["image_id"]), set()).add(names[ann["category_id"]])
        except (TypeError, KeyError):
            raise EdgecapError(f"{path}: annotations[{i}] needs 'image_id' and a known 'category_id'") from None
    return out, id_resolver(out, aliases)
