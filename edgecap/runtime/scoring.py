"""Live object coverage of each caption (edgecap.metrics.coverage), when objects are known.

The scorer needs spaCy and GloVe (`pip install "edgecap[nlp]"`), which a minimal robot install
may lack: then coverage is switched off with one message and the loop runs on.

Loading them takes seconds (benchmarks/README.md, "Start-up"). By default the run waits for
them before its first caption, so every caption is scored. With `background=True` (a live
camera: `--coverage-load background`, the default for cameras and streams) the first caption is
never kept waiting: loading starts on a thread when the first caption is scored, and captions
finished before it is done go out unscored (counted in `unscored`, reported in the summary).
"""

from __future__ import annotations

import threading

from edgecap.contract.objects import KnownObject, class_areas
from edgecap.errors import MissingExtraError

from .records import Mentioned

COVERAGE_OFF = "coverage off: pip install edgecap[nlp]"


def bundle_vectors(bundle) -> str | None:
    """The word vectors coverage needs for this bundle's captions, which `edgecap export` wrote
    into it (edgecap.metrics.subset): a few hundred kB and no pyarrow instead of the 400,000-word
    table. None for a bundle exported without edgecap[nlp] (the whole table is used)."""
    entry = getattr(getattr(bundle, "manifest", None), "coverage", None)
    return str(bundle.path / entry.vectors) if entry else None


class CoverageAnnotator:
    """`score(caption, objects) -> ({">1%": cov, ...}, Mentioned)`, or None when switched off.

    `vocabulary`: the class set the objects come from (edgecap.metrics.vocabulary; None: ACVR's);
    the objects' own class names join it as they come, and one no known class has is logged once.
    `Mentioned` (records.py) is the coverage matches at the lowest threshold with the other side:
    the classes the caption names that are not in view, its precision and F1."""

    def __init__(self, enabled: bool = True, log=print, scorer=None, vocabulary=None, background: bool = False,
                 vectors: str | None = None):
        self.enabled = enabled
        self.vectors = vectors  # the bundle's word vectors (bundle_vectors); None: the whole table
        self.log = log
        self._scorer = scorer
        self._labels = None
        self.vocabulary = vocabulary
        self.background = background
        self._loaded = threading.Event()
        self._loader: threading.Thread | None = None
        self.unscored = 0  # captions with known objects, finished while the scorer was loading

    def _load(self):
        if self._scorer is None:
            from edgecap.metrics.coverage import CoverageScorer  # spaCy + GloVe: seconds to load

            self._scorer = CoverageScorer(glove=self.vectors, vocabulary=self.vocabulary, warn=self.log)
        return self._scorer

    def warm_up(self) -> None:
        """Load spaCy / GloVe and score once now, so their start-up is not the first frame's
        (in the background mode: nothing now; the first score starts the loading)."""
        if self.background:
            return
        scorer = self._get() if self.enabled else None
        if scorer is not None:
            scorer.score(["a cup on a table"], [{"cup": 0.1}])

    def _load_in_background(self) -> None:
        try:
            self.background = False
            self.warm_up()
        finally:
            self._loaded.set()

    def close(self) -> None:
        """Wait for a background load still running: an interpreter that exits while a thread
        is inside an import can abort (a fatal error and a non-zero exit after a clean run)."""
        if self._loader is not None:
            self._loader.join()

    def _get(self):
        try:
            return self._load()
        except MissingExtraError:
            self.enabled = False
            self.log(COVERAGE_OFF)
            return None

    def score(self, caption: str, objects: list[KnownObject] | None):
        if not self.enabled or objects is None:
            return None
        if self.background or (self._loader is not None and not self._loaded.is_set()):
            if self._loader is None:
                self._loader = threading.Thread(target=self._load_in_background, name="edgecap-coverage-load",
                                                daemon=True)
                self._loader.start()
            self.unscored += 1
            return None
        scorer = self._get()
        if scorer is None:
            return None
        from edgecap.metrics.coverage import threshold_label

        result = scorer.score([caption], [class_areas(objects)])[0]
        coverage = {threshold_label(t): v for t, v in result.coverage.items()}
        # The lowest threshold scores the most classes: its matches say which objects the
        # caption mentions (exact names / synonyms, or GloVe-similar nouns with their profit).
        lowest = min(result.matches) if result.matches else None
        matches = [m.to_json() for m in result.matches.get(lowest, [])] if lowest is not None else []
        return coverage, Mentioned(matches, [{"noun": noun, "class": cls} for noun, cls in result.hallucinated],
                                   len(result.mentions), result.precision,
                                   {threshold_label(t): v for t, v in result.f1.items()})
