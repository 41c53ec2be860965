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
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.metrics.vocabulary import ACVR, ClassVocabulary

DEFAULT_THRESHOLDS: tuple[float, ...] = (0.01, 0.03, 0.05, 0.10)
PROFITS = ("clipped-cosine", "shifted-cosine", "exact")
MULTIWORD = ("head", "mean")
# Distinct nouns and class names whose vectors are kept (a bounded cache: a robot that runs for
# weeks meets an unbounded number of distinct nouns)
VECTOR_CACHE = 8192


@lru_cache(maxsize=1)
def _hungarian():
    """scipy's linear_sum_assignment (imported once, on first use: scipy is not needed to import this module)."""
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

    unknown: list[str] = field(default_factory=list)  # GT classes outside the class vocabulary

    @property
    def unknown_classes(self) -> list[str]:
        return self.unknown

    def to_json(self) -> dict:
        return {
            "caption": self.caption,
            "nouns": self.nouns,
            "dropped_nouns": self.dropped,
            "gt": {c: round(a, 6) for c, a in sorted(self.gt.items())},
            "coverage": {threshold_label(t): v for t, v in self.coverage.items()},
            "matches": {threshold_label(t): [m.to_json() for m in ms]
                        for t, ms in self.matches.items()},
        }


class CoverageScorer:
    """Scores captions for object coverage. Loads spaCy and GloVe once (edgecap[nlp]).

    glove: None for the packaged 6B 50-d vectors, or a GloVe text file path.
    profit: "clipped-cosine" | "shifted-cosine" | "exact".  multiword: "head" | "mean".
    vocabulary: the class set in use (edgecap.metrics.vocabulary: ACVR by default, COCO, or a
    categories file's); its multi-word names are read as phrases and its synonyms score 1.0.
    """

    def __init__(self, glove: str | None = None, profit: str = "clipped-cosine",
                 multiword: str = "head", thresholds=DEFAULT_THRESHOLDS,
                 spacy_model: str | None = None, glove_cache: str | None = None,
                 batch_size: int = 512, n_process: int = 1, extractor=None,
                 vocabulary: ClassVocabulary | None = None):
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
            from edgecap.metrics.nouns import NounExtractor

            extractor = NounExtractor(spacy_model, batch_size=batch_size, n_process=n_process,
                                      vocabulary=vocabulary)
        self.extract = extractor
        self.vocabulary = vocabulary or getattr(extractor, "vocabulary", None) or ACVR
        self._class_set = frozenset(self.vocabulary.classes)
        self.phrase_vector = lru_cache(maxsize=VECTOR_CACHE)(self._phrase_vector)

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

    def score_nouns(self, caption: str, nouns: list[str], gt: dict[str, float]) -> CoverageResult:
        """Coverage from already-extracted nouns (what `score` does after spaCy)."""
        linear_sum_assignment = _hungarian()
        gt = {str(c): float(a) for c, a in gt.items()}
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
        unknown = sorted(c for c in gt if c not in self._class_set)
        return CoverageResult(caption, list(nouns), dropped, gt, coverage, matches, unknown)

    def score(self, captions: list[str], gt: list[dict[str, float]]) -> list[CoverageResult]:
        """Coverage of each caption against its image's {class: max area fraction}."""
        if len(captions) != len(gt):
            raise EdgecapError(f"{len(captions)} captions but {len(gt)} ground-truth entries")
        nouns = self.extract(captions)
        return [self.score_nouns(c, n, g) for c, n, g in zip(captions, nouns, gt, strict=False)]


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


def format_table(rows: dict[str, dict], thresholds, recorded: dict[str, dict] | None = None) -> str:
    """SMArT Table IV layout: one row per caption file, one column per area threshold.

    `recorded` (`eval coverage --records`): per row, the coverage the run itself recorded
    ({"thresholds": {label: {"mean", "n_images"}}}), printed under the row with the difference
    (re-scored minus recorded, in points); "-" where the run recorded no such threshold."""
    labels = [threshold_label(t) for t in thresholds]
    recorded = recorded or {}
    names = [*rows, *(["  recorded", "  difference"] if recorded else [])]
    name_w = max([len("captions")] + [len(n) for n in names])

    def line(name: str, texts) -> str:
        return f"{name:<{name_w}}  " + "  ".join(t.rjust(13) for t in texts)

    lines = [line("captions", labels)]
    for name, summary in rows.items():
        lines.append(line(name, [_cell(summary["thresholds"].get(lab, {})) for lab in labels]))
        if name not in recorded:
            continue
        then = recorded[name]["thresholds"]
        lines.append(line("  recorded", [_cell(then[lab]) if lab in then else "-" for lab in labels]))
        diff = coverage_difference(summary["thresholds"], then)
        lines.append(line("  difference", ["-" if diff.get(lab) is None else f"{round(100 * diff[lab], 1) + 0.0:+.1f}"
                                           for lab in labels]))  # + 0.0: no "-0.0" for a rounding residue
    return "\n".join(lines)


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
