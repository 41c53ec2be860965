"""`edgecap demo` on a tiny checkpoint: export once (cached by sha256), caption the synthetic
world, write the JSONL, the summary and the annotated video."""

import json

import pytest

pytest.importorskip("torch")


@pytest.fixture
def tiny_ckpt(tmp_path):
    from tests._export_util import save_tiny

    return save_tiny(tmp_path / "tiny.pt", "smart", n_regions=16,
                     visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]})


def _demo(run_cli, ckpt, out, *extra):
    which = ("--checkpoint", ckpt) if ckpt else ()
    return run_cli("demo", *which, "--out", out, "--frames", "3", "--max-fps", "50",
                   "--size", "64", "--beam", "2", *extra)


def test_demo_exports_once_and_writes_its_outputs(tiny_ckpt, tmp_path, run_cli, monkeypatch):
    import torch

    from edgecap.export import demo_command

    torch.set_num_threads(1)
    out = tmp_path / "demo-out"
    # No --checkpoint: the packaged model (stood in for by the tiny one here).
    monkeypatch.setattr(demo_command, "demo_checkpoint", lambda: tiny_ckpt)
    code, stdout, stderr = _demo(run_cli, None, out)
    assert code == 0, stderr
    assert "exporting" in stdout
    recs = [json.loads(x) for x in (out / "captions.jsonl").read_text().splitlines()]
    assert len(recs) == 3
    assert all(r["source"].startswith("synth://tabletop") and r["objects"] for r in recs)
    if "coverage off" not in stdout:
        assert all(set(r["coverage"]) == {">1%", ">3%", ">5%", ">10%"} for r in recs)
    assert (out / "demo.mp4").stat().st_size > 0
    assert json.loads((out / "captions.summary.json").read_text())["frames_captioned"] == 3
    assert "summary: 3 frames captioned" in stdout and str(out / "demo.mp4") in stdout
    import cv2

    stills = cv2.imread(str(out / "frames.png"))  # frames 0 and 2, annotated, side by side
    assert stills is not None and stills.shape[1] == 2 * 512 and str(out / "frames.png") in stdout
    manifest = (out / "bundle" / "manifest.json").stat().st_mtime_ns

    # Same checkpoint: the cached bundle is reused.
    code, stdout, stderr = _demo(run_cli, tiny_ckpt, out)
    assert code == 0, stderr
    assert "exporting" not in stdout
    assert (out / "bundle" / "manifest.json").stat().st_mtime_ns == manifest

    # A bundle cached by an edgecap that wrote an older bundle format is exported again.
    stamp_path = out / "bundle.source.json"
    stamp = json.loads(stamp_path.read_text())
    stamp_path.write_text(json.dumps({k: v for k, v in stamp.items() if k != "bundle_format"}))
    code, stdout, stderr = _demo(run_cli, tiny_ckpt, out)
    assert code == 0, stderr
    assert "exporting" in stdout

    # A changed checkpoint (new sha256) is exported again.
    from tests._export_util import save_tiny

    save_tiny(tiny_ckpt, "smart", meta={"step": 2}, n_regions=16,
              visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]})
    code, stdout, stderr = _demo(run_cli, tiny_ckpt, out)
    assert code == 0, stderr
    assert "exporting" in stdout


def test_demo_names_a_missing_checkpoint(tmp_path, run_cli, monkeypatch):
    from edgecap.export import demo_command

    code, _, stderr = run_cli("demo", "--checkpoint", tmp_path / "nope.pt", "--out", tmp_path)
    assert code == 1 and "nope.pt does not exist" in stderr
    monkeypatch.setattr(demo_command, "demo_checkpoint", lambda: tmp_path / "demo-smart.pt")
    code, _, stderr = run_cli("demo", "--out", tmp_path)
    assert code == 1 and "packaged demo model" in stderr and "--checkpoint" in stderr


def test_demo_out_keeps_a_users_files(tiny_ckpt, tmp_path, run_cli):
    """Before any export: a frames.png or bundle.source.json in --out that the demo did not
    write is one line, left as it was; the frames.png of a demo --out from before PNGs carried
    edgecap's mark (its stamp is the demo's) is the demo's to rewrite."""
    import cv2
    import numpy as np

    from edgecap.export.demo_command import check_outputs

    photo = tmp_path / "frames.png"
    cv2.imwrite(str(photo), np.full((8, 8, 3), 200, np.uint8))  # a PNG OpenCV wrote, unmarked
    stamp = tmp_path / "bundle.source.json"
    for theirs, what in ((photo, "a PNG edgecap wrote"), (stamp, "the demo's export stamp")):
        before = {p: p.read_bytes() for p in tmp_path.iterdir()}
        if theirs is stamp:
            stamp.write_text('{"my": "settings"}')
            before[stamp] = stamp.read_bytes()
        code, stdout, stderr = _demo(run_cli, tiny_ckpt, tmp_path)
        assert (code, stdout) == (1, "") and stderr.count("\n") == 1, stderr
        assert f"--out {theirs} exists and is not {what}; not overwriting it" in stderr
        assert {p: p.read_bytes() for p in tmp_path.iterdir()} == before  # no bundle/ either
    stamp.write_text(json.dumps({"checkpoint": str(tiny_ckpt), "sha256": "0" * 64, "export": {}}))
    check_outputs(tmp_path)
