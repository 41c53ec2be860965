"""`eval coverage`, `edgecap run`'s per-frame coverage and CHAIR read captions with the same
extraction: the same nouns, the same classes named, the same scores."""

import json

import pytest

pytest.importorskip("spacy")

from edgecap.metrics.chair import Chair  # noqa: E402
from edgecap.metrics.coverage import CoverageScorer, threshold_label  # noqa: E402
from edgecap.metrics.vocabulary import COCO  # noqa: E402
from edgecap.runtime.scoring import CoverageAnnotator  # noqa: E402
from edgecap.runtime.sources import KnownObject  # noqa: E402

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
    from edgecap.runtime.command import _coverage_vocabulary
    from edgecap.runtime.detections import Detections

    results = tmp_path / "coco_instances_results.json"
    results.write_text(json.dumps([{"image_id": 1, "category_id": 88, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    vocabulary = _coverage_vocabulary(Detections(results))
    assert set(vocabulary.classes) == set(COCO.classes) and "teddy bear" in vocabulary.phrases
    cats = tmp_path / "data.yaml"
    cats.write_text("names: [robot arm, mug]\n")
    results.write_text(json.dumps([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.9}]))
    vocabulary = _coverage_vocabulary(Detections(results, categories=load_categories(cats)))
    assert vocabulary.classes == ("robot arm", "mug") and vocabulary.phrases == ["robot arm"]
    lines = tmp_path / "det.jsonl"
    lines.write_text(json.dumps({"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, 5, 5]}]}) + "\n")
    assert _coverage_vocabulary(Detections(lines)) is None  # the scorer's default: ACVR's 30


def test_default_class_set_api_eval_and_run_agree_on_coco_named_objects(run_cli, tmp_path):
    """With no class set named (the API's default, `eval coverage --records`, `edgecap run
    --detections FILE.jsonl`), COCO-named objects bring their class names into the set: all three
    give each frame the same coverage and the same hallucinated mentions."""
    from edgecap.runtime.command import _coverage_vocabulary
    from edgecap.runtime.detections import Detections

    lines = tmp_path / "det.jsonl"
    lines.write_text("".join(json.dumps({"frame_id": i, "objects": [{"class": c, "box": [0, 0, 5, 5]} for c in gt]})
                             + "\n" for i, (_, gt) in enumerate(FRAMES)))
    annotator = CoverageAnnotator(vocabulary=_coverage_vocabulary(Detections(lines)), log=lambda line: None)
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
