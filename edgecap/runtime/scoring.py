"""Live object coverage of each caption (edgecap.metrics.coverage), when objects are known.

The scorer needs spaCy and GloVe (`pip install "edgecap[nlp]"`), which a minimal robot install
may lack: then coverage is switched off with one message and the loop runs on.
"""

from __future__ import annotations

from edgecap.contract.objects import KnownObject, class_areas
from edgecap.errors import MissingExtraError

COVERAGE_OFF = "coverage off: pip install edgecap[nlp]"


class CoverageAnnotator:
    """`score(caption, objects) -> ({">1%": cov, ...}, matches)`, or None when switched off."""

    def __init__(self, enabled: bool = True, log=print, scorer=None):
        self.enabled = enabled
        self.log = log
        self._scorer = scorer
        self._labels = None

    def _load(self):
        if self._scorer is None:
            from edgecap.metrics.coverage import CoverageScorer  # spaCy + GloVe: seconds to load

            self._scorer = CoverageScorer()
        return self._scorer

    def warm_up(self) -> None:
        """Load spaCy / GloVe and score once now, so their start-up is not the first frame's."""
        scorer = self._get() if self.enabled else None
        if scorer is not None:
            scorer.score(["a cup on a table"], [{"cup": 0.1}])

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
        return coverage, matches
