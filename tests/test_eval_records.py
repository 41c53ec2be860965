"""`edgecap eval coverage --records RUN.jsonl`: a recorded run re-scored later from the objects
its records carry (other thresholds, area, GloVe) without running the model again; with the
run's own settings it reproduces the coverage the run printed."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("spacy")

LABELS = (">1%", ">3%", ">5%", ">10%")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A caption log of two --append runs of the packaged demo model over the live world: the
    first scored by box areas, the second by pixel areas."""
    import torch

    from edgecap.cli import main

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("records")
    assert main(["demo", "--out", str(root / "demo"), "--frames", "2"]) == 0
    log = root / "run.jsonl"
    for seed, area in ((2, "box"), (3, "pixels")):
        code = main(["run", str(root / "demo" / "bundle"), "--source", f"synth://tabletop?seed={seed}&size=96",
                     "--frames", "5", "--jsonl", str(log), "--append", "--area", area, "--quiet"])
        assert code == 0
    plain = root / "plain.jsonl"  # without --append: its summary is the file beside it
    assert main(["run", str(root / "demo" / "bundle"), "--source", "synth://tabletop?seed=4&size=96",
                 "--frames", "4", "--jsonl", str(plain), "--quiet"]) == 0
    return log


def _report(run_cli, tmp_path, *argv):
    out = tmp_path / "eval"
    code, stdout, err = run_cli("eval", "coverage", *argv, "--out", out, "--no-plot")
    assert code == 0, err
    return json.loads((out / "coverage.json").read_text()), stdout


def test_records_reproduce_each_appended_runs_own_coverage(recorded, run_cli, tmp_path):
    ends = [json.loads(line) for line in recorded.read_text().splitlines() if '"run_end"' in line]
    assert [e["coverage_rule"] for e in ends] == ["box area > threshold", "pixels area > threshold"]
    doc, stdout = _report(run_cli, tmp_path, "--records", recorded)
    assert list(doc["files"]) == ["run#1", "run#2"] and doc["options"]["area"] == "as recorded"
    for row, end in zip(doc["files"].values(), ends, strict=True):
        got = {k: v["mean"] for k, v in row["summary"]["thresholds"].items()}
        assert got == pytest.approx(end["coverage_mean"], abs=1e-6)
        assert {k: v["n_images"] for k, v in row["summary"]["thresholds"].items()} == end["coverage_frames"]
    assert "run#2: 5 images scored" in stdout and "source synth://tabletop?seed=3&size=96" in stdout


def test_records_rescored_by_the_other_area_and_other_thresholds(recorded, run_cli, tmp_path):
    records = [json.loads(line) for line in recorded.read_text().splitlines()]
    second = [r for r in records if "caption" in r][5:]
    doc, stdout = _report(run_cli, tmp_path, "--records", recorded, "--area", "box", "--thresholds", "0.02", "0.2")
    images = doc["files"]["run#2"]["images"]
    for rec in second:  # run 2 recorded pixel areas; re-scored by each class's largest box
        want = {}
        for o in rec["objects"]:
            want[o["class"]] = max(want.get(o["class"], 0.0), o["box_area"])
        assert images[str(rec["frame_id"])]["gt"] == pytest.approx(want)
        assert any(o["area"] != o["box_area"] for o in rec["objects"])
    assert list(doc["files"]["run#1"]["summary"]["thresholds"]) == [">2%", ">20%"]
    assert stdout.splitlines()[0].split() == ["captions", ">2%", ">20%"]


def test_records_errors(recorded, run_cli, tmp_path):
    old = tmp_path / "old.jsonl"  # objects as records carried them before box_area / pixel_area
    old.write_text(json.dumps({"frame_id": 0, "source": "x", "caption": "a cup",
                               "objects": [{"class": "cup", "box": [0, 0, 9, 9], "area": 0.1}]}) + "\n")
    code, stdout, _ = run_cli("eval", "coverage", "--records", old)
    assert code == 0 and "100.0 (n=1)" in stdout  # by the run's own area: still scored
    code, _, err = run_cli("eval", "coverage", "--records", old, "--area", "box")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"--records {old}: run 1, frame 0: object 'cup' has no 'box_area'" in err
    boxed = tmp_path / "boxed.jsonl"  # a detector without masks: --area pixels scores the box, and says so
    boxed.write_text(json.dumps({"frame_id": 0, "source": "x", "caption": "a cup", "objects": [
        {"class": "cup", "box": [0, 0, 9, 9], "area": 0.1, "box_area": 0.1},
        {"class": "bowl", "box": [0, 0, 9, 9], "area": 0.1, "box_area": 0.1, "pixel_area": 0.02}]}) + "\n")
    code, stdout, _ = run_cli("eval", "coverage", "--records", boxed, "--area", "pixels", "--thresholds", "0.05")
    assert code == 0 and "1 objects without a pixel area scored by their box" in stdout
    assert "100.0 (n=1)" in stdout  # only the cup is above 5% by pixels, and the caption names it
    blind = tmp_path / "camera.jsonl"
    blind.write_text(json.dumps({"frame_id": 0, "source": "0", "caption": "a cup"}) + "\n")
    code, _, err = run_cli("eval", "coverage", "--records", blind)
    assert code == 1 and "no record carries the objects in view" in err.strip().splitlines()[-1]
    code, _, err = run_cli("eval", "coverage", "--records", recorded, "--acvr", tmp_path)
    assert code == 1 and "leave out --acvr" in err
    code, _, err = run_cli("eval", "coverage", "--captions", recorded)
    assert code == 1 and "--captions needs --acvr DIR" in err


def test_read_runs_splits_an_appended_log_at_its_markers(tmp_path):
    from edgecap.contract.runlog import read_runs

    log = tmp_path / "c.jsonl"
    lines = [{"frame_id": 0, "caption": "a"},                     # written without --append
             {"kind": "run_start", "source": "s1"}, {"frame_id": 0, "caption": "b"},
             {"kind": "run_start", "source": "s2"}, {"frame_id": 0, "caption": "c"},  # the first was killed
             {"frame_id": 1, "caption": "d"}, {"kind": "run_end", "frames_captioned": 2}]
    log.write_text("\n".join(json.dumps(x) for x in lines[:3]) + '\n{"frame_id": 1, "cap'
                   + "\n" + "\n".join(json.dumps(x) for x in lines[3:]) + "\n")
    runs, malformed = read_runs(log)
    assert malformed == 1
    assert [[r["caption"] for r in run.records] for run in runs] == [["a"], ["b"], ["c", "d"]]
    assert [(run.start or {}).get("source") for run in runs] == [None, "s1", "s2"]
    assert [run.end is not None for run in runs] == [False, False, True]


def test_records_print_the_runs_own_coverage_beside_the_rescored(recorded, run_cli, tmp_path):
    """Each run's row is followed by what the run itself reported (its run_end summary, the
    summary file beside a log written without --append, or its records' mean when it was
    killed) and the difference, so a re-scoring that does not reproduce the run shows at once."""
    lines = recorded.read_text().splitlines()
    ends = [json.loads(line) for line in lines if '"run_end"' in line]
    killed = tmp_path / "killed.jsonl"  # the second run without its run_end: a SIGKILL
    killed.write_text("\n".join(lines[:-1]) + "\n")
    plain = recorded.with_name("plain.jsonl")
    plain_summary = json.loads(recorded.with_name("plain.summary.json").read_text())
    doc, stdout = _report(run_cli, tmp_path, "--records", recorded, killed, plain)
    for name, end in (("run#1", ends[0]), ("run#2", ends[1]), ("killed#2", ends[1]), ("plain", plain_summary)):
        got = doc["files"][name]["recorded"]
        assert {k: v["mean"] for k, v in got["thresholds"].items()} == pytest.approx(end["coverage_mean"], abs=2e-6)
        assert {k: v["n_images"] for k, v in got["thresholds"].items()} == end["coverage_frames"]
        assert got["rule"] == end["coverage_rule"]  # a killed run's from its run_start line
        assert all(abs(d) < 2e-6 for d in got["difference"].values())  # the run's own settings: reproduced
        printed = stdout.splitlines()
        at = next(i for i, line in enumerate(printed) if line.split()[:1] == [name])
        mine, diff = printed[at + 1].split(), printed[at + 2].split()
        assert mine[0] == "recorded" and diff == ["difference"] + ["+0.0"] * len(LABELS)
        assert mine[1::2] == [f"{100 * end['coverage_mean'][k]:.1f}" for k in LABELS]
    assert [doc["files"][n]["recorded"]["from"] for n in ("run#1", "killed#1", "killed#2", "plain")] == [
        "run_end", "run_end", "records", str(plain.with_name("plain.summary.json"))]
    assert "recorded coverage: its run_end summary, pixels area > threshold" in stdout
    assert "recorded coverage: the mean of its records (no summary: killed), pixels area > threshold" in stdout
    assert json.loads(lines[0])["coverage_rule"] == "box area > threshold"


def test_records_rescored_otherwise_show_how_far_from_the_run(recorded, run_cli, tmp_path):
    doc, stdout = _report(run_cli, tmp_path, "--records", recorded, "--area", "box", "--thresholds", "0.01", "0.3")
    second = doc["files"]["run#2"]  # recorded by pixel areas, re-scored by box areas
    assert second["recorded"]["rule"] == "pixels area > threshold"
    assert set(second["recorded"]["thresholds"]) == set(LABELS) and list(second["recorded"]["difference"]) == [">1%", ">30%"]
    assert second["recorded"]["difference"][">30%"] is None  # the run scored no 30 % column
    want = second["summary"]["thresholds"][">1%"]["mean"] - second["recorded"]["thresholds"][">1%"]["mean"]
    assert second["recorded"]["difference"][">1%"] == pytest.approx(want, abs=1e-6)
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("run#2 "))
    assert lines[at + 1].split()[-1] == "-" and lines[at + 2].split() == [
        "difference", f"{round(100 * want, 1) + 0.0:+.1f}", "-"]
