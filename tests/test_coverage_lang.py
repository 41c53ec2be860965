"""Coverage on real language and any class set (issue 40), read alike everywhere, with the
packaged GloVe vectors.

- The class set follows the objects; plural and official class names, verbs the tagger reads
  as nouns, eyewear, dirt bikes and CHAIR's person words; the per-caption hallucination side.
- `eval coverage`, `edgecap run`'s per-frame coverage and CHAIR read captions with the same
  extraction: the same nouns, the same classes named, the same scores.
- `edgecap eval coverage` reports the other side of coverage beside it (what each caption
  names that is not in view), agreeing with `edgecap eval chair` on the same captions, and reads
  a recorded run's COCO-named objects without false credit, naming an unknown class once."""

import json

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.chair import Chair  # noqa: E402
from edgecap.metrics.coverage import CoverageScorer, threshold_label  # noqa: E402
from edgecap.metrics.vocabulary import COCO, COCO_EXTRA_SYNONYMS, PERSON_WORDS  # noqa: E402
from edgecap.runtime.scoring import CoverageAnnotator  # noqa: E402
from edgecap.runtime.sources import KnownObject  # noqa: E402
from tests.test_eval_cli import write_acvr  # noqa: E402

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


# -- eval coverage, edgecap run and CHAIR read captions alike --------------------------------------
FRAMES = [
    ("a teddy bear next to a hot dog on a dining table", {"teddy bear": 0.1, "hot dog": 0.05, "dining table": 0.3}),
    ("a dog next to a bear", {"hot dog": 0.2, "teddy bear": 0.2}),
    ("two men holding baseball bats", {"person": 0.3, "baseball bat": 0.05}),
    ("a sandwich cut in half on a plate", {"sandwich": 0.2, "bowl": 0.1}),
    ("an orange cat on a couch next to a remote control", {"cat": 0.2, "couch": 0.4, "orange": 0.02}),
    ("Two Teddy Bears and a cell phone", {"teddy bear": 0.3, "laptop": 0.2}),
]


def _objects(gt):
    return [KnownObject(cls, (0.0, 0.0, 9.0, 9.0), area) for cls, area in gt.items()]


@pytest.fixture(scope="module")
def live():
    """The live loop's annotator over COCO's classes, as `edgecap run --detections` makes it."""
    annotator = CoverageAnnotator(vocabulary=COCO)
    return [annotator.score(caption, _objects(gt)) for caption, gt in FRAMES]


def test_the_live_annotator_scores_as_the_scorer(live):
    scorer = CoverageScorer(vocabulary=COCO)
    for (caption, gt), (coverage, matches) in zip(FRAMES, live, strict=True):
        result = scorer.score([caption], [gt])[0]
        assert coverage == {threshold_label(t): v for t, v in result.coverage.items()}
        assert matches == [m.to_json() for m in result.matches[0.01]]


def test_eval_coverage_of_the_records_gives_each_frames_live_score(live, run_cli, tmp_path):
    log = tmp_path / "run.jsonl"
    with log.open("w") as fh:
        for i, ((caption, gt), (coverage, _)) in enumerate(zip(FRAMES, live, strict=True)):
            fh.write(json.dumps({"source": "cam", "frame_id": i, "caption": caption,
                                 "objects": [o.to_json() for o in _objects(gt)], "coverage": coverage}) + "\n")
    code, _, err = run_cli("eval", "coverage", "--records", log, "--classes", "coco", "--out", tmp_path / "e",
                           "--no-plot")
    assert code == 0, err
    doc = json.loads((tmp_path / "e" / "coverage.json").read_text())
    images = doc["files"]["run"]["images"]
    assert doc["options"]["classes"] == COCO.origin
    for i, (coverage, _) in enumerate(live):
        assert images[str(i)]["coverage"] == pytest.approx(coverage, abs=1e-6)


def test_chair_mentions_are_the_nouns_coverage_reads():
    chair = Chair(classes=COCO.classes).read_nouns()
    scorer = CoverageScorer(vocabulary=COCO)
    for caption, gt in FRAMES:
        result = scorer.score([caption], [gt])[0]
        mentions = chair.mentions(caption)
        naming = [n for n in result.nouns if COCO.class_of(n) is not None]
        assert list(dict.fromkeys(noun for noun, _ in mentions)) == naming, caption
        named_in_view = {cls for _, cls in mentions if cls in gt}
        assert named_in_view == {m.cls for m in result.matches[0.01] if m.exact}, caption
    # what the word scan got wrong and the nouns do not: "orange" is a colour here
    assert ("orange", "orange") not in chair.mentions(FRAMES[4][0])
    assert ("orange", "orange") in Chair(classes=COCO.classes).mentions(FRAMES[4][0])


def test_edgecap_run_scores_coco_detections_against_their_categories(tmp_path):
    """`edgecap run --detections` of COCO results reads captions for COCO's 80 classes, or for the
    --categories file's; edgecap's own JSON Lines detections keep ACVR's 30."""
    from edgecap.data.coco_categories import load_categories
    from edgecap.runtime.detections import Detections
    from edgecap.runtime.execute import coverage_vocabulary

    results = tmp_path / "coco_instances_results.json"
    results.write_text(json.dumps([{"image_id": 1, "category_id": 88, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    vocabulary = coverage_vocabulary(Detections(results))
    assert set(vocabulary.classes) == set(COCO.classes) and "teddy bear" in vocabulary.phrases
    cats = tmp_path / "data.yaml"
    cats.write_text("names: [robot arm, mug]\n")
    results.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    vocabulary = coverage_vocabulary(Detections(results, categories=load_categories(cats)))
    assert vocabulary.classes == ("robot arm", "mug") and vocabulary.phrases == ["robot arm"]
    lines = tmp_path / "det.jsonl"
    lines.write_text(json.dumps({"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, 5, 5]}]}) + "\n")
    assert coverage_vocabulary(Detections(lines)) is None  # the scorer's default: ACVR's 30


def test_default_class_set_api_eval_and_run_agree_on_coco_named_objects(run_cli, tmp_path):
    """With no class set named (the API's default, `eval coverage --records`, `edgecap run
    --detections FILE.jsonl`), COCO-named objects bring their class names into the set: all three
    give each frame the same coverage and the same hallucinated mentions."""
    from edgecap.runtime.detections import Detections
    from edgecap.runtime.execute import coverage_vocabulary

    lines = tmp_path / "det.jsonl"
    lines.write_text("".join(json.dumps({"frame_id": i, "objects": [{"class": c, "box": [0, 0, 5, 5]} for c in gt]})
                             + "\n" for i, (_, gt) in enumerate(FRAMES)))
    annotator = CoverageAnnotator(vocabulary=coverage_vocabulary(Detections(lines)), log=lambda line: None)
    live = [annotator.score(caption, _objects(gt)) for caption, gt in FRAMES]
    api = CoverageScorer(warn=lambda line: None).score([c for c, _ in FRAMES], [g for _, g in FRAMES])
    log = tmp_path / "run.jsonl"
    with log.open("w") as fh:
        for i, (caption, gt) in enumerate(FRAMES):
            fh.write(json.dumps({"source": "cam", "frame_id": i, "caption": caption,
                                 "objects": [o.to_json() for o in _objects(gt)]}) + "\n")
    code, _, err = run_cli("eval", "coverage", "--records", log, "--out", tmp_path / "e", "--no-plot")
    assert code == 0, err
    images = json.loads((tmp_path / "e" / "coverage.json").read_text())["files"]["run"]["images"]
    for i, ((coverage, mentioned), result) in enumerate(zip(live, api, strict=True)):
        assert coverage == {threshold_label(t): v for t, v in result.coverage.items()}
        assert images[str(i)]["coverage"] == pytest.approx(coverage, abs=1e-6)
        assert [(h["noun"], h["class"]) for h in mentioned.hallucinated] == result.hallucinated
        assert images[str(i)]["hallucinated"] == [list(h) for h in result.hallucinated]
    assert live[1][0][">1%"] < 0.9  # "a dog next to a bear" against hot dog and teddy bear


# -- eval coverage's other side beside coverage ----------------------------------------------------
EVAL_CAPTIONS = [
    # 3 mentions, none hallucinated: "dog" is no ACVR class, so it names nothing here
    {"image_id": "000000/000000", "caption": "a mug next to a laptop and a dog and a mug"},
    {"image_id": "000000/000001", "caption": "a bottle of water on a table"},  # table: 1 of 2
    {"image_id": "000001/000000", "caption": "a man sitting on a couch"},      # nothing in view: 2 of 2
    {"image_id": "000001/000001", "caption": "a television on a sofa"},        # 0 of 2
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory, run_cli_module):
    root = tmp_path_factory.mktemp("h")
    acvr = write_acvr(root / "acvr")
    captions = root / "captions.json"
    captions.write_text(json.dumps(EVAL_CAPTIONS))
    code, cov_out, err = run_cli_module("eval", "coverage", "--captions", captions, "--acvr", acvr,
                                        "--out", root / "cov", "--no-plot")
    assert code == 0, err
    code, chair_out, err = run_cli_module("eval", "chair", "--captions", captions, "--acvr", acvr,
                                          "--out", root / "chair")
    assert code == 0, err
    return (json.loads((root / "cov" / "coverage.json").read_text())["files"]["captions"], cov_out,
            json.loads((root / "chair" / "chair.json").read_text())["files"]["captions"])


@pytest.fixture(scope="module")
def run_cli_module():
    import contextlib
    import io

    from edgecap.cli import main

    def _run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in argv])
        return code, out.getvalue(), err.getvalue()

    return _run


def test_per_caption_hallucination_agrees_with_eval_chair(reports):
    coverage, _, chair = reports
    assert set(coverage["images"]) == set(chair["captions"])
    for image_id, theirs in chair["captions"].items():
        mine = coverage["images"][image_id]
        assert mine["mentions"] == theirs["mentions"], image_id
        assert mine["hallucinated"] == theirs["hallucinated"], image_id
        if theirs["mentions"]:
            assert mine["precision"] == pytest.approx(1 - theirs["chair_i"], abs=1e-6), image_id
    ours, theirs = coverage["summary"]["hallucination"], chair["summary"]
    for key in ("CHAIR-i", "CHAIR-s", "mentions", "hallucinated_mentions", "captions_with_hallucination"):
        assert ours[key] == pytest.approx(theirs[key]), key
    assert ours["hallucinated_mentions"] == 3  # table (a dining table); man (a person), couch


def test_the_table_prints_the_other_side_beside_coverage(reports):
    coverage, printed, _ = reports
    lines = printed.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("captions ") and "(n=" in line)
    assert lines[row + 1].split()[0] == "F1"
    f1 = coverage["summary"]["hallucination"]["f1"][">1%"]
    assert f"{100 * f1['mean']:5.1f} (n={f1['n_images']})".strip() in lines[row + 1]
    assert "3 of 9 class mentions not in view (CHAIR-i 33.3%), in 2 of 4 captions (CHAIR-s 50.0%)" in printed


def test_records_with_coco_objects_get_no_false_credit_and_one_warning(tmp_path, run_cli_module):
    frames = [
        ("a dog running on the grass next to a bear", [("hot dog", 0.2), ("teddy bear", 0.2)]),
        ("a bat flying near a light", [("baseball bat", 0.2), ("traffic light", 0.2)]),
        ("two people carrying skis", [("person", 0.3), ("skis", 0.1)]),
        ("a television next to a forklift", [("tv", 0.2), ("forklift", 0.2)]),
        ("a forklift", [("forklift", 0.3)]),
    ]
    log = tmp_path / "run.jsonl"
    with log.open("w") as fh:
        for i, (caption, objects) in enumerate(frames):
            fh.write(json.dumps({"source": "cam", "frame_id": i, "caption": caption,
                                 "objects": [{"class": c, "box": [0, 0, 9, 9], "area": a, "box_area": a}
                                             for c, a in objects]}) + "\n")
    code, _, err = run_cli_module("eval", "coverage", "--records", log, "--out", tmp_path / "e", "--no-plot")
    assert code == 0, err
    assert err.count("warning: class 'forklift' of the objects") == 1
    assert "hot dog" not in err and "skis" not in err and "'tv'" not in err
    images = json.loads((tmp_path / "e" / "coverage.json").read_text())["files"]["run"]["images"]
    for i in (0, 1):
        assert images[str(i)]["coverage"][">1%"] < 0.9
        assert not any(m["exact"] for m in images[str(i)]["matches"][">1%"])
    assert images["2"]["coverage"][">1%"] == 1.0
    assert images["3"]["gt"] == {"forklift": 0.2, "television": 0.2} and images["3"]["coverage"][">1%"] == 1.0
