"""benchmarks/pipeline.py: the camera replay, and --quick writing its table, CSV, JSON and plot
(--resume keeping the rows of an earlier part of the sweep)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, f"{REPO}/benchmarks")

from pipeline import COLUMNS, sustained  # noqa: E402


def test_a_captioner_faster_than_the_camera_keeps_every_frame():
    got = sustained([10.0], fps=15)
    assert got["captions_per_s"] == pytest.approx(15, rel=0.01) and got["dropped_pct"] < 1
    assert got["capture_to_caption_p50_ms"] == pytest.approx(10)


def test_a_slow_captioner_takes_the_newest_frame_and_counts_the_drops():
    got = sustained([100.0], fps=30)  # 3 frames arrive per caption: 2 of them are dropped
    assert got["captions_per_s"] == pytest.approx(10, rel=0.01)
    assert got["dropped_pct"] == pytest.approx(100 * 2 / 3, abs=1)
    # 10 fps at 15 fps: the newest frame is on average a few ms old when it is taken
    assert 100 <= sustained([100.0], fps=15)["capture_to_caption_p50_ms"] < 100 + 1000 / 15


def test_quick_run_writes_table_csv_json_and_stage_plot(tmp_path):
    out = tmp_path / "pipe"
    out.mkdir()
    # an earlier part of the sweep (another front end, same settings): --resume keeps its row
    settings = {"frames": 2, "warmup": 1, "threads": 2, "image_size": 64, "quick": True}
    earlier = {"frontend": "ViT-B-32", "captioner": "pma-edge", "backend": "onnxruntime", "batch": 4,
               "status": "ok", **{k: 1.0 for k, _, _ in COLUMNS[4:]}}
    (out / "pipeline.json").write_text(json.dumps({"settings": settings, "rows": [earlier]}))
    from detector_models import write_detector

    detector = tmp_path / "detector.onnx"  # a cup over the whole 320 x 320 input: one cup in every frame
    write_detector(detector, [(1, (160, 160, 320, 320), 0.9)])
    settings["detector"] = str(detector)
    (out / "pipeline.json").write_text(json.dumps({"settings": settings, "rows": [earlier]}))
    cmd = [sys.executable, f"{REPO}/benchmarks/pipeline.py", "--quick", "--backends", "torch,onnxruntime,tensorrt",
           "--batches", "1", "--frames", "2", "--out", str(out), "--resume", "--detector", str(detector)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "pipeline.json").read_text())
    assert [(r["frontend"], r["backend"]) for r in report["rows"]] == [
        ("mobilenet_v3_large", "torch"), ("mobilenet_v3_large", "onnxruntime"), ("mobilenet_v3_large", "tensorrt"),
        ("ViT-B-32", "onnxruntime")]
    assert report["rows"][-1] == earlier and "| ViT-B-32 | pma-edge | onnxruntime | 4 |" in (out / "pipeline.md").read_text()
    rows = {r["backend"]: r for r in report["rows"] if r["frontend"] == "mobilenet_v3_large"}
    ort = rows["onnxruntime"]
    assert ort["status"] == "ok" and ort["frontend"] == "mobilenet_v3_large"
    assert all(ort[f"{s}_ms"] >= 0 for s in ("preprocess", "visual", "encoder", "decode", "coverage"))
    assert ort["visual_ms"] > 0 and ort["total_p99_ms"] >= ort["total_p50_ms"] > 0
    assert ort["rss_mb"] > 0 and ort["bundle_mb"] > 0 and ort["cam15_captions_per_s"] > 0 and ort["load_1m"] >= 0
    assert rows["tensorrt"]["status"] == "skipped" or rows["tensorrt"]["status"] == "ok"
    # the checkpoint in PyTorch (the same beam search over the static cache) writes the same caption
    assert rows["torch"]["status"] == "ok", rows["torch"].get("reason")
    assert rows["torch"]["sample_caption"] == ort["sample_caption"] and rows["torch"]["decode_ms"] > 0
    # --detector: its own stage on every row, and coverage scores its objects (a cup) instead of the world's
    assert ort["detector_ms"] > 0 and rows["torch"]["detector_ms"] > 0 and ort["mean_coverage"] is not None
    assert ort["total_p50_ms"] >= ort["detector_ms"]
    assert "total_p95_ms" in (out / "pipeline.csv").read_text().splitlines()[0]
    assert "| mobilenet_v3_large | smart | onnxruntime | 1 |" in (out / "pipeline.md").read_text()
    assert (out / "pipeline_stages_b1.png").stat().st_size > 1000


def test_quick_cameras_run_the_multi_camera_loop_and_report_each_camera(tmp_path):
    out = tmp_path / "pipe"
    cmd = [sys.executable, f"{REPO}/benchmarks/pipeline.py", "--quick", "--backends", "onnxruntime", "--batches", "2",
           "--cameras", "1,3", "--seconds", "2", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "pipeline.json").read_text())
    assert report["rates"]["bandwidth_gb_s"] > 0 and report["rates"]["fp32_gflop_s"] > 0
    one, three = report["camera_rows"]
    assert (one["cameras"], three["cameras"]) == (1, 3) and one["status"] == three["status"] == "ok"
    assert [c["camera"] for c in three["per_camera"]] == [0, 1, 2]
    assert all(c["captions_per_s"] > 0 for c in three["per_camera"])
    # three cameras on a batch-2 bundle: every round is two batches; how many cameras have a
    # fresh frame at each round depends on how fast this machine captions, so only >= 1
    assert three["batches_per_round"] == 2 and three["rows_per_round"] >= 1
    assert one["rows_per_round"] == 1 and one["captions_per_s"] <= 15 * 1.1  # one 15 fps camera at most
    assert three["p99_ms"] >= three["p50_ms"] > 0 and three["visual_ms"] > 0 and three["decode_bound_ms"] > 0
    assert "| mobilenet_v3_large | smart | onnxruntime | 2 | 3 |" in (out / "pipeline_cameras.md").read_text()
