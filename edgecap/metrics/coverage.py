"""Object coverage of a caption (SMArT, Eq. 10): how many ground-truth object classes it names.

For a caption y and the ground-truth classes c* of its image (those with an instance covering
more than a threshold t of the image, as SMArT's "> t" columns):

    P[i, j]   = profit(noun_i, class_j)          nouns from spaCy, compounds folded
    assign    = argmax over one-to-one matchings of sum P     (Hungarian algorithm)
    Cov_t(y)  = sum of assigned profits / |c*_t|

profit is 1.0 for a noun that names the class outright (its name, an alias or a listed synonym in
the class vocabulary in use, edgecap.metrics.vocabulary), else a function of the GloVe cosine: `clipped-cosine` max(cos, 0) (default) or `shifted-cosine`
(cos + 1) / 2; `exact` gives 0 to everything but names and synonyms. docs/coverage.md gives the
full definition and why these defaults.

The class set follows the objects: the ground truth's class names are read as caption nouns
naming them would be (`ClassVocabulary.class_named`: tv -> television, ski -> skis) and join the
configured set, so their phrases and synonyms are read; a name no known class has is warned
about once. The other side of coverage, per caption (CHAIR-style): every mention of a class that
is not in view is `hallucinated`; precision = in-view mentions / mentions (1 - CHAIR-i), and
F1 = 2 P Cov_t / (P + Cov_t) per threshold.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import math
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.metrics.nouns import NounExtractor
from edgecap.metrics.vocabulary import ACVR, ClassVocabulary

DEFAULT_THRESHOLDS: tuple[float, ...] = (0.01, 0.03, 0.05, 0.10)
PROFITS = ("clipped-cosine", "shifted-cosine", "exact")
MULTIWORD = ("head", "mean")
# Distinct nouns and class names whose vectors are kept (a bounded cache: a robot that runs for
# weeks meets an unbounded number of distinct nouns)
VECTOR_CACHE = 8192


@lru_cache(maxsize=1)
def _hungarian():
    """scipy's linear_sum_assignment (imported once, on first use: scipy is not needed to import
    this module). Its compiled module is loaded on its own: `import scipy.optimize` imports the
    whole optimisation package first, 50 MB of resident memory a robot does not use. Where
    scipy lays it out otherwise, the public import."""
    name = "scipy.optimize._lsap"
    if name not in sys.modules and "scipy.optimize" not in sys.modules:
        try:
            scipy = importlib.util.find_spec("scipy")
            folder = Path(scipy.origin).parent / "optimize"
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                if (folder / f"_lsap{suffix}").is_file():
                    loader = importlib.machinery.ExtensionFileLoader(name, str(folder / f"_lsap{suffix}"))
                    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
                    loader.exec_module(module)
                    return module.linear_sum_assignment
        except (ImportError, AttributeError, OSError, TypeError):
            pass
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment


def threshold_label(t: float) -> str:
    """0.01 -> '>1%' (the column names of SMArT's Table IV)."""
    pct = t * 100
    return f">{pct:g}%"


def exact_class(noun: str, classes=(), vocabulary: ClassVocabulary = ACVR) -> str | None:
    """The class a noun names outright: a class in `classes` (the image's ground truth) by its
    own name, else what the vocabulary lists it as (`ClassVocabulary.class_of`: the name, an
    alias, a synonym, or a compound whose head word is one of those)."""
    if noun in classes:
        return noun
    return vocabulary.class_of(noun)


@dataclass
class Match:
    noun: str
    cls: str
    profit: float
    exact: bool

    def to_json(self) -> dict:
        return {"noun": self.noun, "class": self.cls, "profit": round(self.profit, 6),
                "exact": self.exact}


@dataclass
class CoverageResult:
    """Coverage of one caption against one image's ground truth, at every threshold."""

    caption: str
    nouns: list[str]
    dropped: list[str]                       # nouns with no GloVe vector and no exact match
    gt: dict[str, float]                     # class -> largest instance area fraction
    coverage: dict[float, float | None]      # None: no class above that threshold
    matches: dict[float, list[Match]] = field(default_factory=dict)

    unknown: list[str] = field(default_factory=list)  # GT classes no known class set has
    mentions: list[tuple[str, str]] = field(default_factory=list)      # (noun, class), every occurrence
    hallucinated: list[tuple[str, str]] = field(default_factory=list)  # mentions of a class not in view

    @property
    def unknown_classes(self) -> list[str]:
        return self.unknown

    @property
    def precision(self) -> float | None:
        """Share of the caption's class mentions that name an object in view (1 - CHAIR-i);
        None when it mentions no class."""
        if not self.mentions:
            return None
        return 1.0 - len(self.hallucinated) / len(self.mentions)

    @property
    def f1(self) -> dict[float, float | None]:
        """Per threshold, the harmonic mean of precision and coverage (None where either is)."""
        p = self.precision
        return {t: None if p is None or c is None else (0.0 if p + c == 0 else 2 * p * c / (p + c))
                for t, c in self.coverage.items()}

    def to_json(self) -> dict:
        return {
            "caption": self.caption,
            "nouns": self.nouns,
            "dropped_nouns": self.dropped,
            "gt": {c: round(a, 6) for c, a in sorted(self.gt.items())},
            "coverage": {threshold_label(t): v for t, v in self.coverage.items()},
            "matches": {threshold_label(t): [m.to_json() for m in ms]
                        for t, ms in self.matches.items()},
            "mentions": [list(m) for m in self.mentions],
            "hallucinated": [list(m) for m in self.hallucinated],
            "precision": _rounded(self.precision),
            "f1": {threshold_label(t): _rounded(v) for t, v in self.f1.items()},
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


class CoverageScorer:
    """Scores captions for object coverage. Loads spaCy and GloVe once (edgecap[nlp]).

    glove: None for the packaged 6B 50-d vectors, or a GloVe text file path.
    profit: "clipped-cosine" | "shifted-cosine" | "exact".  multiword: "head" | "mean".
    vocabulary: the class set configured (edgecap.metrics.vocabulary: ACVR by default, COCO, or a
    categories file's); the ground truth's class names join it as they come (`score`). Its
    multi-word names are read as phrases and its synonyms score 1.0.
    warn: called once with a line for each ground-truth class name no known class has (default:
    a Python warning).
    """

    def __init__(self, glove: str | None = None, profit: str = "clipped-cosine",
                 multiword: str = "head", thresholds=DEFAULT_THRESHOLDS,
                 spacy_model: str | None = None, glove_cache: str | None = None,
                 batch_size: int = 512, n_process: int = 1, extractor=None,
                 vocabulary: ClassVocabulary | None = None, warn=None):
        if profit not in PROFITS:
            raise EdgecapError(f"unknown coverage profit {profit!r}; expected one of {', '.join(PROFITS)}")
        if multiword not in MULTIWORD:
            raise EdgecapError(f"unknown multiword policy {multiword!r}; expected one of {', '.join(MULTIWORD)}")
        thresholds = tuple(sorted(float(t) for t in thresholds))
        if not thresholds or any(not 0.0 <= t <= 1.0 for t in thresholds):
            raise EdgecapError(f"coverage thresholds must be area fractions in [0, 1], got {thresholds}")
        from edgecap.metrics.glove import load_glove

        self.profit = profit
        self.multiword = multiword
        self.thresholds = thresholds
        self.glove = load_glove(glove, glove_cache)
        if extractor is None:
            extractor = NounExtractor(spacy_model, batch_size=batch_size, n_process=n_process,
                                      vocabulary=vocabulary)
        self.extract = extractor
        self.configured = vocabulary or getattr(extractor, "vocabulary", None) or ACVR
        self.vocabulary = self.configured
        self.warn = warn or (lambda line: warnings.warn(line, stacklevel=5))  # at the caller of score
        self._class_of_name: dict[str, str] = {}  # ground-truth name -> its class (class_named)
        self.phrase_vector = lru_cache(maxsize=VECTOR_CACHE)(self._phrase_vector)

    # -- the class set -------------------------------------------------------------------
    def ground_truth(self, gt: dict) -> dict[str, float]:
        """{class: area} with each class name read as a caption noun naming it would be
        ("tv" and "monitor" -> television, "ski" -> skis; the largest area where two names are
        one class), the class set grown by any class it did not hold (`follow`)."""
        out: dict[str, float] = {}
        for name, area in gt.items():
            cls = self._class_of_name.get(name)
            if cls is None:
                cls = self._class_of_name[name] = self.vocabulary.class_named(str(name))
                self.follow([cls], {cls: name})
            out[cls] = max(out.get(cls, 0.0), float(area))
        return out

    def follow(self, classes, raw: dict[str, str] | None = None) -> None:
        """Add these (canonical) class names to the class set in use: their phrases are read
        from now on, their synonyms name them. A name no known class set has is warned about
        once, naming it as the objects spell it (`raw`)."""
        new = [c for c in dict.fromkeys(classes) if c not in self.vocabulary.classes]
        if not new:
            return
        self.vocabulary = self.vocabulary.with_classes(new)
        self.phrase_vector.cache_clear()  # whether a head word names its class may have changed
        use = getattr(self.extract, "use_vocabulary", None)
        if use is not None:
            use(self.vocabulary)
        for cls in new:
            if not self.configured.knows(cls):
                spelled = (raw or {}).get(cls, cls)
                self.warn(f"class {spelled!r} of the objects is not a class of {self.configured.origin or 'the class set'} "
                          f"or COCO's 80, nor a synonym of one: scored as a class of its own, named by "
                          f"{cls!r} and its plural, else by GloVe")

    # -- vectors and profits -------------------------------------------------------------
    def _phrase_vector(self, phrase: str) -> np.ndarray | None:
        """Unit vector of a noun or class name; None if unknown. A multi-word name under the
        `head` policy is its head word's vector when the head word names the same class (a
        cell phone is a phone) and the mean of its words' otherwise (a hot dog is no dog)."""
        words = phrase.split()
        if not words:
            return None
        if len(words) == 1 or (self.multiword == "head" and self.vocabulary.head_names(phrase)):
            return self.glove.vector(words[-1])
        vecs = [v for v in (self.glove.vector(w) for w in words) if v is not None]
        if not vecs:
            return None
        mean = np.mean(vecs, axis=0)
        norm = float(np.linalg.norm(mean))
        return (mean / norm).astype(np.float32) if norm > 0 else None

    def _from_cosine(self, cos: np.ndarray) -> np.ndarray:
        if self.profit == "clipped-cosine":
            return np.clip(cos, 0.0, 1.0)
        return np.clip((cos + 1.0) / 2.0, 0.0, 1.0)

    def profit_matrix(self, nouns: list[str], classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(profits [n_nouns, n_classes], exact [n_nouns, n_classes] bool)."""
        P = np.zeros((len(nouns), len(classes)), dtype=np.float64)
        exact = np.zeros_like(P, dtype=bool)
        if not nouns or not classes:
            return P, exact
        cls_vecs = [self.phrase_vector(c) for c in classes]
        col_has = np.array([v is not None for v in cls_vecs])
        C = np.stack([v if v is not None else np.zeros(self.glove.dim, np.float32) for v in cls_vecs])
        gt_set = set(classes)
        if self.profit != "exact" and col_has.any():
            vecs = [self.phrase_vector(noun) for noun in nouns]
            rows = [i for i, v in enumerate(vecs) if v is not None]
            if rows:  # one product for every noun with a vector
                N = np.stack([vecs[i] for i in rows])
                P[rows] = np.where(col_has, self._from_cosine(N @ C.T), 0.0)
        for i, noun in enumerate(nouns):
            hit = exact_class(noun, gt_set, self.vocabulary)
            if hit in gt_set:
                j = classes.index(hit)
                P[i, j] = 1.0
                exact[i, j] = True
        return P, exact

    # -- scoring -------------------------------------------------------------------------
    def usable_nouns(self, nouns: list[str], classes) -> tuple[list[str], list[str]]:
        """Split nouns into (scored, dropped): dropped have no vector and name no class."""
        keep, dropped = [], []
        for noun in nouns:
            if self.phrase_vector(noun) is not None or exact_class(noun, classes, self.vocabulary):
                keep.append(noun)
            else:
                dropped.append(noun)
        return keep, dropped

    def score_nouns(self, caption: str, nouns: list[str], gt: dict[str, float],
                    mentions: list[str] | None = None) -> CoverageResult:
        """Coverage from already-extracted nouns (what `score` does after spaCy); `mentions`:
        every noun occurrence, repeats kept (default: `nouns`), for the hallucination side."""
        linear_sum_assignment = _hungarian()
        gt = self.ground_truth(gt)
        keep, dropped = self.usable_nouns(nouns, gt)
        all_classes = sorted(gt)
        P_all, exact_all = self.profit_matrix(keep, all_classes)
        coverage: dict[float, float | None] = {}
        matches: dict[float, list[Match]] = {}
        previous: tuple | None = None
        for t in self.thresholds:
            cols = [j for j, c in enumerate(all_classes) if gt[c] > t]
            if not cols:
                coverage[t], matches[t] = None, []
                continue
            if previous is not None and previous[0] == cols:
                coverage[t], matches[t] = previous[1], list(previous[2])
                continue
            P = P_all[:, cols]
            found: list[Match] = []
            total = 0.0
            if P.shape[0]:
                rows, picked = linear_sum_assignment(P, maximize=True)
                for r, k in zip(rows, picked, strict=False):
                    p = float(P[r, k])
                    total += p
                    if p > 0:
                        found.append(Match(keep[r], all_classes[cols[k]], p, bool(exact_all[r, cols[k]])))
            cov = total / len(cols)
            coverage[t], matches[t] = cov, found
            previous = (cols, cov, found)
        unknown = sorted(c for c in gt if not self.configured.knows(c))
        named = [(noun, cls) for noun in (nouns if mentions is None else mentions)
                 if (cls := exact_class(noun, gt, self.vocabulary)) is not None]
        return CoverageResult(caption, list(nouns), dropped, gt, coverage, matches, unknown,
                              named, [m for m in named if m[1] not in gt])

    def score(self, captions: list[str], gt: list[dict[str, float]]) -> list[CoverageResult]:
        """Coverage of each caption against its image's {class: max area fraction}."""
        if len(captions) != len(gt):
            raise EdgecapError(f"{len(captions)} captions but {len(gt)} ground-truth entries")
        gt = [self.ground_truth(g) for g in gt]  # before reading: the class set may grow
        mentions = getattr(self.extract, "mentions", None)
        if mentions is None:
            nouns = self.extract(captions)
            every = nouns
        else:
            every = mentions(captions)
            nouns = [list(dict.fromkeys(n)) for n in every]
        return [self.score_nouns(c, n, g, list(m))
                for c, n, g, m in zip(captions, nouns, gt, every, strict=True)]


def summarize(results: list[CoverageResult], thresholds=None) -> dict:
    """Mean coverage per threshold over images with a class above it, plus counts.

    Returns {"thresholds": {">1%": {"threshold", "mean", "n_images"}}, "per_class": {...},
    "counts": {...}}. Per-class: for each threshold, the mean profit matched to a class over
    the images where that class is above the threshold.
    """
    if thresholds is None:
        thresholds = sorted({t for r in results for t in r.coverage})
    out: dict = {"thresholds": {}, "per_class": {}}
    for t in thresholds:
        vals = [r.coverage[t] for r in results if r.coverage.get(t) is not None]
        out["thresholds"][threshold_label(t)] = {
            "threshold": t,
            "mean": float(np.mean(vals)) if vals else None,
            "n_images": len(vals),
        }
        sums: dict[str, list[float]] = defaultdict(list)
        for r in results:
            if r.coverage.get(t) is None:
                continue
            got = {m.cls: m.profit for m in r.matches.get(t, [])}
            for c, a in r.gt.items():
                if a > t:
                    sums[c].append(got.get(c, 0.0))
        out["per_class"][threshold_label(t)] = {
            c: {"mean": float(np.mean(v)), "n_images": len(v)} for c, v in sorted(sums.items())
        }
    out["hallucination"] = hallucination_summary(results)
    out["counts"] = {
        "images": len(results),
        "empty_captions": sum(1 for r in results if not r.caption.strip()),
        "captions_without_nouns": sum(1 for r in results if r.caption.strip() and not r.nouns),
        "images_without_objects": sum(1 for r in results if not r.gt),
        "nouns": sum(len(r.nouns) for r in results),
        "dropped_nouns": sum(len(r.dropped) for r in results),
        "unknown_classes": sorted({c for r in results for c in r.unknown_classes}),
    }
    return out


def hallucination_summary(results: list[CoverageResult]) -> dict:
    """The other side of coverage over a caption set, CHAIR's way: CHAIR-i (hallucinated
    mentions / mentions), CHAIR-s (captions with one / captions), the mean per-caption
    precision (over captions that mention a class) and mean F1 per threshold."""
    mentions = sum(len(r.mentions) for r in results)
    hallucinated = sum(len(r.hallucinated) for r in results)
    with_one = sum(1 for r in results if r.hallucinated)
    precisions = [p for r in results if (p := r.precision) is not None]
    f1: dict[str, dict] = {}
    for t in sorted({t for r in results for t in r.coverage}):
        values = [v for r in results if (v := r.f1.get(t)) is not None]
        f1[threshold_label(t)] = {"mean": float(np.mean(values)) if values else None, "n_images": len(values)}
    return {
        "CHAIR-i": hallucinated / mentions if mentions else 0.0,
        "CHAIR-s": with_one / len(results) if results else 0.0,
        "mentions": mentions,
        "hallucinated_mentions": hallucinated,
        "captions_with_hallucination": with_one,
        "precision": {"mean": float(np.mean(precisions)) if precisions else None, "n_images": len(precisions)},
        "f1": f1,
    }


def format_table(rows: dict[str, dict], thresholds, recorded: dict[str, dict] | None = None) -> str:
    """SMArT Table IV layout: one row per caption file, one column per area threshold.

    `recorded` (`eval coverage --records`): per row, the coverage the run itself recorded
    ({"thresholds": {label: {"mean", "n_images"}}}), printed under the row with the difference
    (re-scored minus recorded, in points); "-" where the run recorded no such threshold."""
    labels = [threshold_label(t) for t in thresholds]
    recorded = recorded or {}
    names = [*rows, *(["  recorded", "  difference"] if recorded else [])]  # "  F1" is shorter
    name_w = max([len("captions")] + [len(n) for n in names])

    def line(name: str, texts) -> str:
        return f"{name:<{name_w}}  " + "  ".join(t.rjust(13) for t in texts)

    lines = [line("captions", labels)]
    for name, summary in rows.items():
        lines.append(line(name, [_cell(summary["thresholds"].get(lab, {})) for lab in labels]))
        if name in recorded:
            then = recorded[name]["thresholds"]
            lines.append(line("  recorded", [_cell(then[lab]) if lab in then else "-" for lab in labels]))
            diff = coverage_difference(summary["thresholds"], then)
            lines.append(line("  difference", ["-" if diff.get(lab) is None else f"{round(100 * diff[lab], 1) + 0.0:+.1f}"
                                               for lab in labels]))  # + 0.0: no "-0.0" for a rounding residue
        f1 = summary.get("hallucination", {}).get("f1", {})
        if any(cell.get("mean") is not None for cell in f1.values()):  # the other side, beside coverage
            lines.append(line("  F1", [_cell(f1.get(lab, {})) for lab in labels]))
    return "\n".join(lines)


def hallucination_line(name: str, summary: dict) -> str:
    """The count line of the other side of coverage: class mentions not in view (CHAIR-i),
    captions with one (CHAIR-s) and the mean per-caption precision."""
    h = summary["hallucination"]
    captions = summary["counts"]["images"]
    precision = h["precision"]
    shown = "-" if precision["mean"] is None else f"{100 * precision['mean']:.1f}"
    return (f"{name}: {h['hallucinated_mentions']} of {h['mentions']} class mentions not in view "
            f"(CHAIR-i {100 * h['CHAIR-i']:.1f}%), in {h['captions_with_hallucination']} of {captions} captions "
            f"(CHAIR-s {100 * h['CHAIR-s']:.1f}%); mean precision {shown} (n={precision['n_images']}); "
            "F1 = 2 P Cov / (P + Cov) per caption")


def _cell(cell: dict) -> str:
    mean = cell.get("mean")
    text = "-" if mean is None or math.isnan(mean) else f"{100 * mean:5.1f}"
    return f"{text} (n={cell.get('n_images', 0)})"


def coverage_difference(now: dict, then: dict) -> dict[str, float | None]:
    """Per threshold label of `now`: its mean coverage minus `then`'s (both {label: {"mean",
    ...}}), None where either has no mean."""
    out = {}
    for label, cell in now.items():
        a, b = cell.get("mean"), then.get(label, {}).get("mean")
        # to the 6 decimals records and summaries keep: what is left below is their rounding
        out[label] = None if a is None or b is None or math.isnan(a) or math.isnan(b) else round(a - b, 6) + 0.0
    return out
