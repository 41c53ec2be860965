"""Coverage on real language and any class set (issue 40), with the packaged GloVe vectors:
the class set follows the objects, plural and official class names, verbs the tagger reads as
nouns, eyewear, dirt bikes and CHAIR's person words, and the per-caption hallucination side."""

import json

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.chair import Chair  # noqa: E402
from edgecap.metrics.coverage import CoverageScorer  # noqa: E402
from edgecap.metrics.vocabulary import COCO, COCO_EXTRA_SYNONYMS, PERSON_WORDS  # noqa: E402
from edgecap.runtime.scoring import CoverageAnnotator  # noqa: E402
from edgecap.runtime.sources import KnownObject  # noqa: E402

# COCO's names of two or more words (and "skis", "scissors": plural names of one)
COCO_MULTIWORD = [c for c in COCO.classes if " " in c]


@pytest.fixture(scope="module")
def default():
    """The scorer as `CoverageScorer()` and `edgecap run --detections FILE.jsonl` make it:
    configured for ACVR's 30 classes."""
    return CoverageScorer(warn=lambda line: None)


def one(scorer, caption, gt):
    return scorer.score([caption], [gt])[0]


def test_the_default_class_set_grows_with_the_objects_and_gives_no_false_credit(default):
    assert len(COCO_MULTIWORD) >= 14
    for cls in COCO_MULTIWORD:
        head = cls.split()[-1]
        named = one(default, f"a {cls} on the floor", {cls: 0.2})
        assert named.coverage[0.01] == 1.0 and named.matches[0.01][0].exact, cls
        alone = one(default, f"a {head} on the floor", {cls: 0.2})
        if COCO.names.get(head) != cls:  # "bear" is no teddy bear, "dog" no hot dog ...
            assert alone.coverage[0.01] < 1.0 and not any(m.exact for m in alone.matches[0.01]), cls
    dog_bear = one(default, "a dog running on the grass next to a bear", {"hot dog": 0.2, "teddy bear": 0.2})
    assert dog_bear.coverage[0.01] < 0.9 and not any(m.exact for m in dog_bear.matches[0.01])
    bat_light = one(default, "a bat flying near a light", {"baseball bat": 0.2, "traffic light": 0.2})
    assert bat_light.coverage[0.01] < 0.9 and not any(m.exact for m in bat_light.matches[0.01])
    # the class set's own synonyms come with a class: "hotdog" names hot dog once hot dog is in view
    assert one(default, "a hotdog", {"hot dog": 0.2}).coverage[0.01] == 1.0


def test_the_default_scores_coco_ground_truth_as_the_coco_class_set_does(default):
    coco = CoverageScorer(vocabulary=COCO)
    cases = [("a dog running on the grass next to a bear", {"hot dog": 0.2, "teddy bear": 0.2}),
             ("a puppy sitting beside a bear", {"dog": 0.2, "teddy bear": 0.2}),
             ("a man on a motorbike next to a fire hydrant", {"person": 0.2, "motorcycle": 0.2, "fire hydrant": 0.05}),
             ("a doughnut and a hot dog vendor", {"donut": 0.1, "hot dog": 0.1, "person": 0.3})]
    for caption, gt in cases:
        assert one(default, caption, gt).coverage == pytest.approx(one(coco, caption, gt).coverage), caption


def test_plural_class_names_get_exact_credit(default):
    for caption, gt in (("two people carrying skis", {"person": 0.3, "skis": 0.1}),
                        ("a man holding a ski", {"person": 0.3, "skis": 0.1}),
                        ("a pair of scissors on a desk", {"scissors": 0.1, "dining table": 0.3})):
        result = one(default, caption, gt)
        assert result.coverage[0.01] == 1.0, (caption, result.nouns)
        assert all(m.exact for m in result.matches[0.01])


def test_a_categories_files_plural_names_are_exact_too(tmp_path):
    from edgecap.metrics.vocabulary import load_vocabulary

    cats = tmp_path / "data.yaml"
    cats.write_text("names: [traffic cones, hair clippers, boxes]\n")
    scorer = CoverageScorer(vocabulary=load_vocabulary(str(cats)))
    result = one(scorer, "a traffic cone next to hair clippers and two boxes",
                 {"traffic cones": 0.1, "hair clippers": 0.1, "boxes": 0.1})
    assert result.coverage[0.01] == 1.0 and all(m.exact for m in result.matches[0.01])


def test_ground_truth_names_are_read_as_caption_nouns(default):
    for name in ("tv", "TV", "television", "monitor", "tvmonitor"):
        result = one(default, "a television on a stand", {name: 0.2})
        assert result.gt == {"television": 0.2} and result.coverage[0.01] == 1.0, name
    assert one(default, "two skis", {"ski": 0.1}).gt == {"skis": 0.1}
    assert one(default, "a cup", {"mug": 0.1, "cup": 0.3}).gt == {"cup": 0.3}  # one class: the largest


def test_an_unknown_class_is_named_once_in_a_warning():
    lines = []
    scorer = CoverageScorer(warn=lines.append)
    for _ in range(3):
        result = one(scorer, "a forklift next to a pallet jack", {"forklift": 0.2, "pallet jack": 0.1, "cup": 0.1})
    assert result.coverage[0.01] == pytest.approx(2 / 3)  # both named by their own names, read as phrases
    assert result.unknown_classes == ["forklift", "pallet jack"]
    assert len(lines) == 2 and "'forklift'" in lines[0] and "'pallet jack'" in lines[1]
    assert not any("cup" in line for line in lines)
    with pytest.warns(UserWarning, match="class 'robot_arm' of the objects"):
        CoverageScorer().score(["a robot arm"], [{"robot_arm": 0.2}])


@pytest.mark.parametrize("caption, nouns", [
    ("a family congregate in a park", ["family", "park"]),          # a verb only, never a noun
    ("a man skis down a hill", ["man", "hill"]),                    # "a" + singular + -s form
    ("a little girl sits on a bench", ["girl", "bench"]),
    ("a girl with glasses drinks from a cup", ["girl", "glasses", "cup"]),  # plural + -s form
    ("two coffee mugs on a table", ["coffee mug", "table"]),        # a real plural compound stays
    ("the coffee mugs on the table", ["coffee mug", "table"]),
    ("a dog runs through the grass", ["dog", "grass"]),             # tagged as a verb: nothing to do
])
def test_a_verb_the_tagger_makes_a_noun_is_not_folded(default, caption, nouns):
    assert default.extract([caption])[0] == nouns


def test_glasses_dirt_bikes_and_person_words(default):
    assert one(default, "a woman wearing glasses", {"person": 0.3, "wine glass": 0.05}).matches[0.01][-1].exact is False
    assert one(default, "two glasses of wine", {"wine glass": 0.05}).coverage[0.01] == 1.0
    assert one(default, "two wine glasses", {"wine glass": 0.05}).coverage[0.01] == 1.0
    dirt = one(default, "a man rides a dirt bike", {"person": 0.3, "motorcycle": 0.2, "bicycle": 0.2})
    assert {m.cls for m in dirt.matches[0.01] if m.exact} == {"person", "motorcycle"}
    for word in ("player", "kid", "skier", "guy", "rider", "kids", "players", "baseball player"):
        assert one(default, f"a {word} in a park", {"person": 0.3}).coverage[0.01] == 1.0, word
    assert "person" in PERSON_WORDS or "people" in PERSON_WORDS
    assert COCO_EXTRA_SYNONYMS["dirt bike"] == "motorcycle"


def test_the_other_side_counts_what_the_caption_names_that_is_not_in_view(default):
    result = one(default, "a dog next to a cup and a dog on a couch", {"cup": 0.1, "couch": 0.3})
    assert result.mentions == [("dog", "dog"), ("cup", "cup"), ("dog", "dog"), ("couch", "couch")]
    assert result.hallucinated == [("dog", "dog"), ("dog", "dog")]
    assert result.precision == pytest.approx(0.5)
    assert result.f1[0.01] == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    silent = one(default, "an empty room", {"cup": 0.1})
    assert silent.precision is None and silent.f1[0.01] is None and silent.hallucinated == []


CAPTIONS = [
    ("a dog next to a cup and a dog", {"cup": 0.1}),
    ("a man holding a teddy bear on a bed", {"person": 0.3, "teddy bear": 0.05}),
    ("a kid eating a hot dog at a dining table", {"person": 0.2, "hot dog": 0.02, "dining table": 0.4}),
    ("a laptop and a mouse on a desk", {"laptop": 0.2, "keyboard": 0.1}),
    ("an empty room", {"chair": 0.1}),
    ("two people carrying skis past a tv", {"person": 0.2, "skis": 0.1}),
]


def test_per_caption_hallucination_agrees_with_chair():
    scorer = CoverageScorer(vocabulary=COCO)
    chair = Chair(classes=COCO.classes).read_nouns()
    results = scorer.score([c for c, _ in CAPTIONS], [g for _, g in CAPTIONS])
    offline = chair.score_all([c for c, _ in CAPTIONS], [set(g) for _, g in CAPTIONS])
    for result, theirs in zip(results, offline, strict=True):
        assert result.mentions == theirs.mentions, result.caption
        assert result.hallucinated == theirs.hallucinated, result.caption
        if theirs.mentions:
            assert result.precision == pytest.approx(1 - theirs.chair_i)
    assert results[5].hallucinated == [("tv", "television")]


def test_the_live_annotator_puts_the_other_side_in_records_and_the_summary():
    import numpy as np

    from edgecap.runtime.camera import Frame
    from edgecap.runtime.captioner import Caption
    from edgecap.runtime.records import Mentioned, Record, Summary

    logged = []
    annotator = CoverageAnnotator(log=logged.append, vocabulary=COCO)  # as for COCO detections
    scored = [annotator.score(caption, [KnownObject(c, (0, 0, 9, 9), a) for c, a in gt.items()])
              for caption, gt in CAPTIONS]
    annotator.score("a crate", [KnownObject("crate", (0, 0, 9, 9), 0.2)])
    annotator.score("a crate", [KnownObject("crate", (0, 0, 9, 9), 0.2)])
    assert len([line for line in logged if "'crate'" in line]) == 1  # named once, in the run's log
    _, mentioned = scored[0]
    assert isinstance(mentioned, Mentioned) and mentioned.hallucinated == [{"noun": "dog", "class": "dog"}] * 2
    assert mentioned.mentions == 3 and mentioned.precision == pytest.approx(1 / 3)
    summary = Summary("test")
    records = []
    for i, ((caption, gt), (coverage, matches)) in enumerate(zip(CAPTIONS, scored, strict=True)):
        frame = Frame(np.zeros((10, 10, 3), np.uint8), i, 0.0, 0.0,
                      [KnownObject(c, (0, 0, 9, 9), a) for c, a in gt.items()])
        records.append(Record(frame, Caption(caption, []), "test", 0.0, coverage, matches))
        summary.add(records[-1])  # what the loop does with every record
    line = json.loads(json.dumps(records[0].to_json()))
    assert line["hallucinated"] == [{"noun": "dog", "class": "dog"}] * 2 and line["mentions"] == 3
    assert line["precision"] == pytest.approx(1 / 3, abs=1e-6) and line["f1"][">1%"] == pytest.approx(0.5, abs=1e-6)
    assert line["mentioned"] == [{"noun": "cup", "class": "cup", "profit": 1.0, "exact": True}]
    assert "not in view: dog" in records[0].human()
    h = summary.to_json()["hallucination"]
    assert h["frames"] == len(CAPTIONS) and h["mentions"] == sum(m.mentions for _, m in scored)
    # dog x2; bed; mouse and desk (a dining table); tv
    assert h["hallucinated_mentions"] == 6 and h["frames_with_hallucination"] == 4
    assert h["CHAIR-s"] == pytest.approx(4 / 6, abs=1e-6)
    assert "CHAIR-s 66.7%" in summary.human()
