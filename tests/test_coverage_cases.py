"""The hand-worked coverage table (tests/data/coverage_cases.json, reported in docs/coverage.md).

Every expected noun list and coverage in the table was worked out by hand from the definition in
docs/coverage.md, with the table's own 12-d word vectors (so each cosine is exact). spaCy
(edgecap[nlp]) extracts the nouns, as in production.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.coverage import CoverageScorer  # noqa: E402
from edgecap.metrics.vocabulary import NAMED, vocabulary_of  # noqa: E402

TABLE = json.loads((Path(__file__).parent / "data" / "coverage_cases.json").read_text(encoding="utf-8"))
CASES = TABLE["cases"]
DOC = Path(__file__).resolve().parents[1] / "docs" / "coverage.md"


def caption_of(case) -> str:
    return case["caption"] * case.get("repeat", 1)


@pytest.fixture(scope="module")
def scorers(tmp_path_factory):
    """One scorer per (class set, profit), all over the table's vectors."""
    folder = tmp_path_factory.mktemp("glove")
    path = folder / "cases.12d.txt"
    rows = []
    for word, axes in TABLE["glove"].items():
        vec = [0.0] * 12
        for axis, value in axes.items():
            vec[int(axis)] = value
        rows.append(f"{word} {' '.join(str(v) for v in vec)}\n")
    path.write_text("".join(rows))
    made = {}

    def get(classes, profit):
        key = (json.dumps(classes), profit)
        if key not in made:
            vocab = NAMED[classes] if isinstance(classes, str) else vocabulary_of(classes, "case")
            made[key] = CoverageScorer(glove=str(path), glove_cache=str(folder / "cache"), profit=profit,
                                       thresholds=(0.01,), vocabulary=vocab)
        return made[key]

    return get


def test_the_table_covers_what_the_issue_asks():
    assert len(CASES) >= 30
    assert len({c["id"] for c in CASES}) == len(CASES)
    named = {c for case in CASES for c, _ in case["objects"]}
    assert {"wine glass", "potted plant", "cell phone", "dining table"} <= named
    coco_multiword = {c for case in CASES if case["classes"] == "coco" for c, _ in case["objects"] if " " in c}
    assert len(coco_multiword) >= 12, sorted(coco_multiword)
    at_threshold = [case["id"] for case in CASES
                    if any(a == t for _, a in case["objects"] for t in case["thresholds"])]
    assert len(at_threshold) >= 3


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_hand_worked_case(case, scorers):
    scorer = scorers(case["classes"], case.get("profit", "clipped-cosine"))
    gt: dict[str, float] = {}
    for cls, area in case["objects"]:
        gt[cls] = max(gt.get(cls, 0.0), area)
    caption = caption_of(case)
    nouns = scorer.extract([caption])[0]
    assert nouns == case["nouns"]
    scorer.thresholds = tuple(case["thresholds"])
    result = scorer.score_nouns(caption, nouns, gt)
    got = [result.coverage[t] for t in case["thresholds"]]
    for value, expected in zip(got, case["coverage"], strict=True):
        if expected is None:
            assert value is None, (case["working"], got)
        else:
            assert value == pytest.approx(expected, abs=1e-6), (case["working"], got)


def test_docs_report_the_table():
    """docs/coverage.md lists every case with its nouns and expected coverage."""
    text = DOC.read_text(encoding="utf-8")
    for case in CASES:
        assert f"`{case['id']}`" in text, case["id"]
        row = next(line for line in text.splitlines() if f"`{case['id']}`" in line)
        for value in case["coverage"]:
            assert ("–" if value is None else f"{value:.4g}") in row, (case["id"], row)
