"""`edgecap eval coverage` reports the other side of coverage beside it (what each caption names
that is not in view), agreeing with `edgecap eval chair` on the same captions, and reads a
recorded run's COCO-named objects without false credit, naming an unknown class once."""

import json

import pytest

pytest.importorskip("spacy")

from tests.test_eval_cli import write_acvr  # noqa: E402

CAPTIONS = [
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
    captions.write_text(json.dumps(CAPTIONS))
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
