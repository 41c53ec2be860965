"""`edgecap eval coverage | coco | chair` end to end on small ACVR / Karpathy fixtures."""

import io
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest

from edgecap.cli import main

SIZE = 100  # 10,000 pixels per frame


def write_acvr(root):
    """Two sequences in the challenge layout; each box covers exactly num_pixels pixels."""
    frames = {
        "000000": {"000000": {"cup": 2000, "laptop": 600, "chair": 50},     # 20%, 6%, 0.5%
                   "000001": {"bottle": 400}},                                # 4%
        "000001": {"000000": {},                                            # no objects
                   "000001": {"tvmonitor": 1500, "sofa": 3000}},            # television, couch
    }
    for seq, per_frame in frames.items():
        d = root / seq
        d.mkdir(parents=True)
        labels = {}
        for frame_id, objs in per_frame.items():
            cv2.imwrite(str(d / f"{frame_id}_mask.png"), np.zeros((SIZE, SIZE), np.uint8))
            entry = {"_metadata": {"mask_name": f"{frame_id}_mask.png"}}
            for k, (cls, px) in enumerate(objs.items()):
                width = SIZE if px >= SIZE else 10
                entry[str(k)] = {"class": cls, "mask_id": k + 1,
                                 "bounding_box": [0, 0, width - 1, px // width - 1], "num_pixels": px}
            labels[frame_id] = entry
        (d / "labels.json").write_text(json.dumps(labels))
    return root


@pytest.fixture(scope="module")
def acvr(tmp_path_factory):
    return write_acvr(tmp_path_factory.mktemp("acvr"))


@pytest.fixture(scope="module")
def captions(tmp_path_factory):
    d = tmp_path_factory.mktemp("captions")
    good = d / "good.json"
    good.write_text(json.dumps([
        {"image_id": "000000/000000", "caption": "a mug next to a laptop"},
        {"image_id": "000000/1", "caption": "a bottle of water"},
        {"image_id": "000001/000000", "caption": "an empty room"},
        {"image_id": "000001/000001", "caption": "a tv and a dog on a sofa"},
        {"image_id": "999999/000000", "caption": "a cup"},
    ]))
    runtime = d / "runtime.jsonl"
    runtime.write_bytes(
        b'{"source": "/cam/000000", "frame_id": 0, "caption": "a cup on a table"}\n'
        b'{"image_id": "000000/000001", "caption": "a bottle \xff\xfe"}\n'
        b'this is not json\n'
        b'{"source": "/cam/000001", "frame_id": 1, "error": "decoder timeout"}\n'
    )
    return good, runtime


@pytest.fixture(scope="module")
def coverage_run(acvr, captions, tmp_path_factory):
    pytest.importorskip("spacy")
    out = tmp_path_factory.mktemp("out")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["eval", "coverage", "--captions", str(captions[0]), str(captions[1]),
                   "--acvr", str(acvr), "--out", str(out)])
    return rc, buf.getvalue(), out


def test_coverage_table_and_outputs(coverage_run):
    rc, text, out = coverage_run
    assert rc == 0
    header = text.splitlines()[0]
    assert header.split()[1:] == [">1%", ">3%", ">5%", ">10%"]
    good_row = next(line for line in text.splitlines() if line.startswith("good "))
    # >10%: frame 0 {cup} covered by mug (1.0); frame 3 {television, couch} covered by tv, sofa
    assert "100.0 (n=2)" in good_row
    doc = json.loads((out / "coverage.json").read_text())
    good = doc["files"]["good"]
    assert good["summary"]["thresholds"][">10%"] == {"threshold": 0.1, "mean": 1.0, "n_images": 2}
    # >1%: frame 0 {cup, laptop}: 1.0; frame 1 {bottle}: 1.0; frame 3: 1.0 -> three images
    assert good["summary"]["thresholds"][">1%"]["n_images"] == 3
    assert good["summary"]["counts"]["unknown_image_ids"] == 1
    assert good["summary"]["counts"]["images_without_objects"] == 1
    img = good["images"]["000000/000000"]
    assert img["nouns"] == ["mug", "laptop"]
    assert {m["class"]: m["profit"] for m in img["matches"][">1%"]} == {"cup": 1.0, "laptop": 1.0}
    assert (out / "coverage_thresholds.png").stat().st_size > 1000
    assert (out / "coverage_classes.png").stat().st_size > 1000


def test_box_or_pixel_areas_and_unlisted_classes(tmp_path, capsys):
    """A cup whose mask covers 0.5 % of the frame but whose box covers 4 %: SMArT's (box) area
    puts it in the >1% and >3% columns, pixel areas in none; coverage.json says which."""
    pytest.importorskip("spacy")
    seq = tmp_path / "acvr" / "000000"
    seq.mkdir(parents=True)
    (seq / "labels.json").write_text(json.dumps({"000000": {
        "_metadata": {"width": SIZE, "height": SIZE},
        "1": {"class": "cup", "mask_id": 1, "bounding_box": [0, 0, 19, 19], "num_pixels": 50},
        "2": {"class": "teddy bear", "mask_id": 2, "bounding_box": [0, 0, 49, 49], "num_pixels": 2500},
        "3": {"class": "background", "mask_id": 0, "bounding_box": [0, 0, 99, 99], "num_pixels": 9000}}}))
    caps = tmp_path / "caps.json"
    caps.write_text(json.dumps([{"image_id": "000000/000000", "caption": "a cup"}]))
    docs = {}
    for area in ("box", "pixels"):
        out = tmp_path / area
        assert main(["eval", "coverage", "--captions", str(caps), "--acvr", str(tmp_path / "acvr"),
                     "--out", str(out), "--area", area, "--no-plot"]) == 0
        docs[area] = json.loads((out / "coverage.json").read_text())
        err = capsys.readouterr().err
        assert "1 instances of classes outside the challenge's list dropped" in err and "'teddy bear' x1" in err
    box, pixels = (docs[a]["files"]["caps"]["summary"] for a in ("box", "pixels"))
    assert {k: v["n_images"] for k, v in box["thresholds"].items()} == {">1%": 1, ">3%": 1, ">5%": 0, ">10%": 0}
    assert all(v["n_images"] == 0 for v in pixels["thresholds"].values())
    assert docs["box"]["options"]["area"] == "box" and docs["pixels"]["options"]["area"] == "pixels"
    assert docs["box"]["options"]["threshold_rule"] == "area > threshold"
    assert box["counts"]["unlisted_instances"] == {"teddy bear": 1}
    assert docs["box"]["files"]["caps"]["images"]["000000/000000"]["gt"] == {"cup": 0.04}  # no 'none'


def test_area_choices_are_the_loaders():
    from edgecap.contract.objects import AREAS
    from edgecap.metrics.command import AREA_CHOICES, AREA_DEFINITIONS

    assert AREA_CHOICES == AREAS == tuple(AREA_DEFINITIONS)


def test_runtime_jsonl_dirty_input_is_counted(coverage_run):
    rc, text, out = coverage_run
    counts = json.loads((out / "coverage.json").read_text())["files"]["runtime"]["summary"]["counts"]
    assert counts["file_malformed_records"] == 1
    assert counts["file_non_utf8_records"] == 1
    assert counts["file_missing_caption"] == 1 and counts["empty_captions"] == 1
    # the caption with bytes that are not UTF-8 is left out (scored, it would lose a word)
    assert counts["images"] == 2
    assert "1 malformed and 1 non-UTF-8 records" in text


def test_no_matching_ids_is_a_one_line_error(acvr, tmp_path, capsys):
    pytest.importorskip("spacy")
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": 42, "caption": "a cup"}]))
    assert main(["eval", "coverage", "--captions", str(preds), "--acvr", str(acvr)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "none of its 1 image ids is an ACVR frame" in err


def test_chair_without_matching_ids_names_the_ids_it_expected(acvr, tmp_path, capsys):
    """COCO-style results against ACVR ground truth: the error shows both kinds of id."""
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": 42, "caption": "a cup"}]))
    assert main(["eval", "chair", "--captions", str(preds), "--acvr", str(acvr)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"none of its 1 image ids is an ACVR frame under {acvr}" in err
    assert "expected ids like '000000/" in err and "first seen '000042'" in err


def test_chair_on_acvr(acvr, captions, tmp_path, capsys):
    assert main(["eval", "chair", "--captions", str(captions[0]), "--acvr", str(acvr),
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "chair.json").read_text())
    s = doc["files"]["good"]["summary"]
    # mentions: mug, laptop | bottle | - | tv, sofa  ("dog" is not an ACVR class): none hallucinated
    assert (s["mentions"], s["hallucinated_mentions"], s["CHAIR-s"]) == (5, 0, 0.0)
    assert main(["eval", "chair", "--captions", str(captions[0]), "--acvr", str(acvr),
                 "--min-area", "0.05"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("good")][-1]
    # with objects >= 5% only, "bottle" (4%) is hallucinated in 1 of 4 captions: CHAIR-s 25.00
    assert row.split()[1:3] == ["25.00", "20.00"]


def test_coco_command(tmp_path, capsys):
    import shutil

    if shutil.which("java") is None:
        pytest.skip("java needed")
    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [
        {"cocoid": 7, "filename": "x.jpg", "split": "test", "sentences": [{"raw": "A cup on a table."}]},
        {"cocoid": 8, "filename": "y.jpg", "split": "test", "sentences": [{"raw": "A dog on a sofa."}]}]}))
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": 7, "caption": "a cup on a table"}]))
    assert main(["eval", "coco", "--captions", str(preds), "--refs", str(refs), "--no-meteor",
                 "--spice", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "BLEU-1       100.00" in text and "SPICE" in text and "1 reference images without a prediction" in text
    doc = json.loads((tmp_path / "coco_metrics.json").read_text())
    assert doc["per_image"]["7"]["ROUGE-L"] == pytest.approx(1.0)


# captions_val2014.json as COCO ships it (the official coco-caption evaluator's annotation file)
COCO_CAPTIONS = {
    "info": {"description": "COCO 2014 Dataset"}, "licenses": [], "type": "captions",
    "images": [{"id": 391895, "file_name": "COCO_val2014_000000391895.jpg", "height": 360, "width": 640},
               {"id": 522418, "file_name": "COCO_val2014_000000522418.jpg", "height": 480, "width": 640},
               {"id": 184613, "file_name": "COCO_val2014_000000184613.jpg", "height": 336, "width": 500}],
    "annotations": [
        {"image_id": 391895, "id": 1, "caption": "A man with a red helmet on a small moped on a dirt road. "},
        {"image_id": 391895, "id": 2, "caption": "Man riding a motor bike on a dirt road on the countryside."},
        {"image_id": 522418, "id": 3, "caption": "A woman wearing a net on her head cutting a cake. "},
        {"image_id": 522418, "id": 4, "caption": "A woman cutting a large white sheet cake."},
        {"image_id": 184613, "id": 5, "caption": "A child holding a flowered umbrella and petting a yak."}]}


def test_coco_captions_file_scores_like_the_official_evaluator(tmp_path, capsys):
    import contextlib
    import io
    import shutil

    if shutil.which("java") is None:
        pytest.skip("java needed")
    pytest.importorskip("pycocoevalcap")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    from pycocotools.coco import COCO

    refs = tmp_path / "captions_val2014.json"
    refs.write_text(json.dumps(COCO_CAPTIONS))
    clean = [{"image_id": 391895, "caption": "a man riding a motorcycle on a dirt road"},
             {"image_id": 522418, "caption": "a woman cutting a cake"},
             {"image_id": 184613, "caption": "a child with an umbrella next to a cow"}]
    (tmp_path / "clean.json").write_text(json.dumps(clean))
    # the same results as other captioning code writes them: a str id, extra keys, an image twice
    # (the first caption counts), a file name or a zero-padded number for an id
    ours = [{"image_id": "391895", "caption": clean[0]["caption"], "id": 0, "score": -3.2},
            {"image_id": "COCO_val2014_000000522418.jpg", "caption": clean[1]["caption"]},
            {"image_id": 391895, "caption": "a dog"},
            {"image_id": "000000184613", "caption": clean[2]["caption"]}]  # a COCO 2017 file stem
    (tmp_path / "ours.json").write_text(json.dumps(ours))
    # the official evaluator's pipeline (COCOEvalCap.evaluate without METEOR/SPICE)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(refs))
        res = coco.loadRes(str(tmp_path / "clean.json"))
        ids = res.getImgIds()
        gts = PTBTokenizer().tokenize({i: coco.imgToAnns[i] for i in ids})
        cands = PTBTokenizer().tokenize({i: res.imgToAnns[i] for i in ids})
        bleu4 = Bleu(4).compute_score(gts, cands)[0][3]
        cider = Cider().compute_score(gts, cands)[0]
    assert main(["eval", "coco", "--captions", str(tmp_path / "ours.json"), "--refs", str(refs),
                 "--no-meteor"]) == 0
    out = capsys.readouterr().out
    scores = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()[1:7]}
    assert scores["BLEU-4"] == pytest.approx(100 * bleu4, abs=0.005)
    assert scores["CIDEr-D"] == pytest.approx(100 * cider, abs=0.005)
    assert "3 images scored" in out and "0 reference images without a prediction" in out
    assert "1 repeated image ids (first caption kept" in out
    # a COCO captions file has no Karpathy splits: asking for one is an error, not an empty split
    assert main(["eval", "coco", "--captions", str(tmp_path / "ours.json"), "--refs", str(refs),
                 "--split", "val"]) == 1
    assert "captions_val2014.json: a COCO captions file has no splits (split 'val' asked)" in capsys.readouterr().err
    # COCO's test image list (image_info_test2014.json) holds no captions to score against
    info = tmp_path / "image_info_test2014.json"
    info.write_text(json.dumps({"info": {}, "images": COCO_CAPTIONS["images"], "categories": []}))
    assert main(["eval", "coco", "--captions", str(tmp_path / "ours.json"), "--refs", str(info)]) == 1
    assert ("image_info_test2014.json: its images have no 'split' and it has no 'annotations': neither a "
            "Karpathy dataset JSON nor a COCO captions file") in capsys.readouterr().err


def test_metrics_package_never_imports_torch():
    code = ("import sys, edgecap.metrics.coverage, edgecap.metrics.ciderd, edgecap.metrics.coco, "
            "edgecap.metrics.chair, edgecap.metrics.command, edgecap.data.acvr; "
            "from edgecap.metrics.ciderd import CiderD; CiderD([['a b']]).score(['a'], [['a b']]); "
            "assert 'torch' not in sys.modules and 'spacy' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_caption_reader_json_list_with_bad_bytes(tmp_path):
    from edgecap.errors import EdgecapError
    from edgecap.metrics.captions import read_captions

    path = tmp_path / "p.json"
    path.write_bytes(b'[{"image_id": 1, "caption": "a cup \xff"}, {"image_id": 1, "caption": "dup"},'
                     b' {"image_id": 2}, 7, {"image_id": 2, "caption": "again"}]')
    cap = read_captions(path)
    # the caption whose bytes are not UTF-8 is left out, so id 1's first caption is the next one
    assert cap.captions == {"1": "dup", "2": ""}
    assert cap.counts["non_utf8_records"] == 1 and cap.counts["duplicates"] == 1
    assert cap.counts["missing_caption"] == 1 and cap.counts["malformed_records"] == 1
    path.write_text("garbage\n")
    with pytest.raises(EdgecapError, match="no caption records found"):
        read_captions(path)


def test_coco_command_keeps_the_tokenizer_jvm_quiet(tmp_path, capfd):
    import shutil

    if shutil.which("java") is None:
        pytest.skip("java needed")
    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [
        {"cocoid": 7, "filename": "x.jpg", "split": "test", "sentences": [{"raw": "A cup on a table."}]}]}))
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"image_id": 7, "caption": "a cup on a table"}]))
    assert main(["eval", "coco", "--captions", str(preds), "--refs", str(refs), "--no-meteor"]) == 0
    captured = capfd.readouterr()
    assert "BLEU-1" in captured.out
    assert captured.err == "", captured.err  # was: "PTBTokenizer tokenized 7 tokens at ..." per call


@pytest.mark.parametrize("command, name", [("coverage", "coverage.json"), ("coverage", "coverage_classes.png"),
                                           ("chair", "chair.json"), ("coco", "coco_metrics.json")])
def test_eval_out_never_replaces_a_file_it_did_not_write(acvr, captions, tmp_path, run_cli, command, name):
    theirs = tmp_path / name
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n their chart" if name.endswith(".png") else b'{"their": "notes"}')
    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [{"cocoid": 7, "filename": "x.jpg", "split": "test",
                                            "sentences": [{"raw": "A cup."}]}]}))
    sources = {"coverage": ["--acvr", acvr], "chair": ["--acvr", acvr], "coco": ["--refs", refs]}[command]
    code, out, err = run_cli("eval", command, "--captions", captions[0], *sources, "--out", tmp_path)
    assert (code, out) == (1, "") and err.count("\n") == 1, err
    assert f"--out {theirs} exists and is not a" in err and "not overwriting it" in err
    assert theirs.read_bytes().endswith(b"their chart" if name.endswith(".png") else b'"notes"}')


def test_eval_out_replaces_its_own_reports(coverage_run, acvr, captions, run_cli):
    """What an earlier eval wrote into --out (JSON with its keys, PNGs marked as edgecap's) it
    writes again."""
    pytest.importorskip("spacy")
    from edgecap.png import is_ours

    _, _, out = coverage_run
    assert is_ours(out / "coverage_thresholds.png") and is_ours(out / "coverage_classes.png")
    for command in ("coverage", "chair", "chair"):
        code, _, err = run_cli("eval", command, "--captions", captions[0], "--acvr", acvr, "--out", out)
        assert code == 0, err
    assert json.loads((out / "chair.json").read_text())["files"]["good"]["summary"]["mentions"] == 5


def test_coverage_draws_no_bar_into_a_captured_stderr(acvr, captions, capsys):
    """stderr captured (not a terminal): the counts and warnings, but no progress bar of the
    ACVR loading or the scoring chunks (edgecap.progress's one rule)."""
    pytest.importorskip("spacy")
    assert main(["eval", "coverage", "--captions", str(captions[0]), "--acvr", str(acvr), "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert "ACVR sequences" not in err and "coverage good" not in err and "\r" not in err


@pytest.mark.parametrize("command", ["coverage", "chair"])
def test_coco_results_against_acvr_say_how_to_caption_the_frames(acvr, tmp_path, command):
    """The file `edgecap caption IMAGES --json` writes for COCO images (integer COCO ids) can
    never match ACVR's <sequence>/<frame> ids: one line, exit 1, and what to run instead."""
    if command == "coverage":
        pytest.importorskip("spacy")
    preds = tmp_path / "val_captions.json"
    preds.write_text(json.dumps([{"image_id": 391895, "caption": "a man riding a bike"},
                                 {"image_id": 522418, "caption": "a woman cutting a cake"}]))
    done = subprocess.run([sys.executable, "-m", "edgecap", "eval", command, "--captions", str(preds),
                           "--acvr", str(acvr)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    err = done.stderr.strip()
    assert "\n" not in err
    assert f"none of its 2 image ids is an ACVR frame under {acvr}" in err and "first seen '391895'" in err
    assert f"caption the ACVR frames with edgecap run BUNDLE --source {acvr} --jsonl FILE" in err


def test_run_over_acvr_then_eval_coverage_as_the_docs_say(tmp_path):
    """docs/coverage.md: `edgecap run BUNDLE --source ACVR_ROOT --jsonl F` names each record by
    its ACVR frame, so `eval coverage --captions F --acvr ACVR_ROOT` scores every frame."""
    pytest.importorskip("spacy")
    from runtime_helpers import FakeBundle

    from edgecap.data.synth import generate_dataset
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.command import RunSettings, execute

    world = tmp_path / "world"
    generate_dataset(world, 1, size=32, sequences=2, frames_per_sequence=3, video_frames=0, progress=False)
    jsonl = tmp_path / "acvr.jsonl"
    execute(Captioner(FakeBundle()), RunSettings(source=str(world / "acvr"), jsonl=str(jsonl), quiet=True),
            out=io.StringIO())
    out = tmp_path / "report"
    assert main(["eval", "coverage", "--captions", str(jsonl), "--acvr", str(world / "acvr"),
                 "--out", str(out), "--no-plot"]) == 0
    counts = json.loads((out / "coverage.json").read_text())["files"]["acvr"]["summary"]["counts"]
    assert counts["images"] == 6 and counts["unknown_image_ids"] == 0 and counts["frames_without_caption"] == 0
