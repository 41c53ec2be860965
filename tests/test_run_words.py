"""What `edgecap run` says matches what it did: under --pace every no frame is dropped (the
frame read ahead when --frames stops the run was counted as one), and --jsonl r.jsonl writes
its summary to r.summary.json, as docs/runtime.md says."""

import json

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("words"))


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    from edgecap.data.synth import generate_dataset

    out = tmp_path_factory.mktemp("words-world") / "data"
    generate_dataset(out, n_images=1, seed=1, size=32, sequences=0, video_frames=20, progress=False)
    return out / "video" / "tabletop.mp4"


@pytest.mark.parametrize("source", ["video", "synth://tabletop?seed=1&size=32"])
def test_pace_every_drops_nothing_when_frames_stops_the_run(bundle, video, tmp_path, run_cli, source):
    source = str(video) if source == "video" else source
    log = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", source, "--pace", "every", "--frames", 6,
                                   "--jsonl", log, "--quiet")
    assert code == 0, stderr
    assert "summary: 6 frames captioned, 0 dropped," in stdout
    summary = json.loads((tmp_path / "r.summary.json").read_text())  # r.jsonl -> r.summary.json
    assert (summary["frames_captioned"], summary["frames_dropped"], summary["frames_captured"]) == (6, 0, 6)
    assert f"summary: {tmp_path / 'r.summary.json'}" in stdout
    assert not (tmp_path / "r.jsonl.summary.json").exists()


def test_the_docs_name_the_summary_file_the_run_writes():
    from pathlib import Path

    runtime = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    assert "`--jsonl r.jsonl` writes `r.summary.json`" in runtime
    assert "FILE.summary.json" not in runtime
