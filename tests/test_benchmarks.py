"""The benchmark scripts keep working, each run as a user runs it (mostly `--quick`):

- benchmarks/latency.py --quick: table, CSV, JSON and plots are written.
- benchmarks/pipeline.py: the camera replay, and --quick writing its table, CSV, JSON and plot
  (--resume keeping the rows of an earlier part of the sweep).
- benchmarks/loop.py --quick runs `edgecap run` on a video at target rates and reports them.
- benchmarks/startup.py --quick: `edgecap run` started fresh, timed to its first caption, with
  and without coverage, and its start-up steps stamped.
- benchmarks/log_read.py --quick writes logs in every storage and times each reader on them.
- benchmarks/fleet.py --quick: `edgecap run` and `edgecap fleet` over the same synthetic robot
  logs, both summaries read, the comparison written as JSON, a table and a PNG.
- benchmarks/gpu_check.py: one line and exit 0 without a GPU; with the CPU provider standing in
  for the GPU, the parity and timing code runs end to end on only the packages a GPU machine has.

benchmarks/soak.py and the fused-attention experiment have files of their own
(test_soak_benchmark.py, test_fused_attention_benchmark.py: their own skip conditions); the
official M² code is checked in test_beam_reference.py."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, f"{REPO}/benchmarks")

from pipeline import COLUMNS, sustained  # noqa: E402


# -- benchmarks/latency.py -------------------------------------------------------------------------
def test_latency_quick_writes_table_csv_json_and_plots(tmp_path):
    out = tmp_path / "lat"
    cmd = [sys.executable, f"{REPO}/benchmarks/latency.py", "--quick", "--models", "smart,m2,updown",
           "--backends", "m2-official,torch-nocache,torch,onnxruntime,onnxruntime-int8-wo,tensorrt", "--batch-sizes", "2", "--beam", "2",
           "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "x bound" in run.stdout and "captions/s" in run.stdout
    assert "setting/s" not in run.stderr and "settings:" not in run.stderr  # no bar drawn into a pipe
    report = json.loads((out / "latency.json").read_text())
    rows = {(r["model"], r["backend"]): r for r in report["rows"]}
    assert rows[("smart", "torch")]["status"] == "ok"
    assert rows[("smart", "onnxruntime")]["status"] == "ok"
    assert rows[("smart", "onnxruntime")]["ratio_to_bound"] > 0
    # against the sum of its two limits the step is at most as far as against the larger one
    fp32_step = rows[("smart", "onnxruntime")]
    assert 0 < fp32_step["graph_sum_ratio"] < fp32_step["step_sum_ratio"] <= fp32_step["step_ratio"]
    # the weight-only bundle: its own export (MatMulNBits step), bounded by one byte per weight;
    # that lowers the bound only where moving the weights limits the step: when this machine's
    # measured FLOP rate (a loaded machine) makes the tiny step compute-bound, the bounds are equal
    weight_only, fp32 = rows[("smart", "onnxruntime-int8-wo")], rows[("smart", "onnxruntime")]
    assert weight_only["status"] == "ok" and weight_only["step_bound_ms"] <= fp32["step_bound_ms"]
    if fp32["step_bound_kind"] == "bandwidth":
        assert weight_only["step_bound_ms"] < fp32["step_bound_ms"]
    # speed-ups against both references: the official M² code's beam search (M² only) and the prefix re-run
    table = (out / "latency.md").read_text()
    assert "| onnxruntime-int8-wo vs official |" in table and "| onnxruntime vs prefix re-run |" in table
    assert rows[("m2", "m2-official")]["status"] == "ok" and rows[("m2", "m2-official")]["ms_per_caption"] > 0
    assert "meshed cross-attention" in rows[("smart", "m2-official")]["reason"]
    assert rows[("updown", "torch-nocache")]["status"] == "skipped"
    assert "tensorrt" in rows[("smart", "tensorrt")]["reason"] or rows[("smart", "tensorrt")]["status"] == "ok"
    assert report["memory_bandwidth_gb_s"] > 0 and report["host"]["logical_cores"] >= 1
    header = (out / "latency.csv").read_text().splitlines()[0]
    assert "ms_per_caption" in header and "ratio_to_bound" in header
    assert (out / "latency_vs_batch_beam2.png").stat().st_size > 1000
    assert (out / "throughput_vs_latency.png").exists()
    assert (out / "step_vs_rows.png").stat().st_size > 1000  # the per-step breakdown, drawn
    assert rows[("smart", "onnxruntime")]["load_1m"] >= 0
    assert "| smart | 2 | 2 |" in (out / "latency.md").read_text()
    assert "| step / graph x sum of limits |" in (out / "latency.md").read_text()
    (out / "latency.md").unlink()
    replot = subprocess.run([*cmd, "--replot"], capture_output=True, text=True, timeout=120)
    assert replot.returncode == 0 and (out / "latency.md").exists()


def run_ort_settings(out, *args) -> dict:
    """benchmarks/ort_settings.py --quick on the tiny SMArT with ARGS -> its JSON report."""
    cmd = [sys.executable, f"{REPO}/benchmarks/ort_settings.py", "--quick", "--model", "smart", *args, "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads((out / "ort_settings.json").read_text())


def test_ort_settings_quick_reports_fusions_start_and_spinning(tmp_path):
    out = tmp_path / "ort"
    report = run_ort_settings(out)
    for precision in ("fp32", "int8"):
        b = report["bundles"][precision]
        assert b["fusions"]["decoder_step"]["nodes_in_session"] < b["fusions"]["decoder_step"]["nodes"]
        assert b["start"]["optimised_at_start_ms"] > 0 and b["spinning"]["no_spin"]["cpu_ms"] > 0
    assert "DynamicQuantizeMatMul" in report["bundles"]["int8"]["fusions"]["decoder_step"]["made_in_session"]
    assert "| int8 | decoder_step |" in (out / "ort_settings.md").read_text()


def test_ort_settings_times_the_step_against_another_revision(tmp_path):
    # HEAD's export of the same checkpoint: the same graph, so the same node counts on both sides
    out = tmp_path / "against"
    report = run_ort_settings(out, "--only", "against", "--against", "HEAD")
    for precision in ("fp32", "int8"):
        graphs = report["bundles"][precision]["against"]
        assert list(graphs) == ["HEAD", "this checkout"]
        ours, theirs = graphs["this checkout"], graphs["HEAD"]
        assert ours["step_ms"] > 0 and theirs["vs_first"] == 1.0
        assert ours["exported"] == theirs["exported"] and ours["in_session"]["nodes"] > 0
    assert "| int8 | this checkout |" in (out / "ort_settings.md").read_text()


def test_ort_settings_times_weight_only_steps_and_their_caption_agreement(tmp_path):
    # the tiny step graph re-quantized by onnxruntime's weight-only MatMulNBits, timed in turns
    # against fp32 and dynamic int8; the packaged demo model's captions compared per variant
    out = tmp_path / "wonly"
    w = run_ort_settings(out, "--beam", "1", "--only", "weight-only")["weight_only"]
    assert w["rows"] == 1 and not w["failed"]
    assert list(w["steps"]) == ["fp32", "dynamic int8", "w8-b256-a4", "w4-b32-a0"]
    assert all(s["step_ms"] > 0 and s["vs_bound"] > 0 for s in w["steps"].values())
    assert w["steps"]["dynamic int8"]["vs_dynamic_int8"] == 1.0
    # whole captions for the bundles that compute in int8 (accuracy level 4), not the 4-bit fp32 one
    assert [n for n, s in w["steps"].items() if s["caption_ms"]] == ["fp32", "dynamic int8", "w8-b256-a4"]
    assert list(w["encoder_ms"]) == ["fp32", "dynamic int8", "w8-b256-a4"]
    sizes = {name: s["bundle_mb"] for name, s in w["steps"].items()}
    assert sizes["w4-b32-a0"] < sizes["dynamic int8"] < sizes["fp32"]  # 4-bit weights are the smallest
    agreement = w["agreement"]
    assert agreement["fp32"]["greedy_identical"] == 1.0 and agreement["fp32"]["beam_identical"] == 1.0
    assert "synthetic world" in agreement["w8-b256-a4"]["inputs"] and agreement["w8-b256-a4"]["samples"] == 4
    assert agreement["w4-b32-a0"]["bundle_mb"] < agreement["fp32"]["bundle_mb"]
    assert "| w8-b256-a4 |" in (out / "ort_settings.md").read_text()


def test_latency_help_names_the_quick_defaults():
    out = subprocess.run([sys.executable, f"{REPO}/benchmarks/latency.py", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "(smart,m2 with --quick)" in " ".join(out.split())


# -- benchmarks/pipeline.py ------------------------------------------------------------------------
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


# -- benchmarks/loop.py ----------------------------------------------------------------------------
def test_loop_benchmark_reports_fps_drops_and_latency(tmp_path):
    from tests._export_util import export, save_tiny

    visual = {"kind": "cnn", "image_size": 16, "channels": [8, 24]}
    ckpt = save_tiny(tmp_path / "tiny.pt", "smart", visual=visual, n_regions=16)
    bundle = tmp_path / "bundle"
    export(ckpt, bundle)
    out = tmp_path / "loop"
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/loop.py", "--bundle", str(bundle), "--quick",
                          "--rates", "5,0", "--beam", "2", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "achieved fps" in run.stdout
    rows = json.loads((out / "loop.json").read_text())["rows"]
    assert [r["target_fps"] for r in rows] == [5.0, None]
    assert all(r["status"] == "ok" and r["captioned"] == 6 for r in rows)
    assert rows[0]["fps"] <= 5.5  # the rate limit holds
    assert rows[0]["latency_p50_ms"] > 0


# -- benchmarks/startup.py -------------------------------------------------------------------------
def test_startup_quick_times_the_first_caption_and_the_memory(tmp_path):
    out = tmp_path / "startup"
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/startup.py", "--quick", "--out", str(out),
                          "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["coverage"].removesuffix(" (off: no edgecap[nlp])"): r for r in json.loads((out / "startup.json").read_text())["rows"]}
    assert set(rows) == {"off", "on", "on, no torch", "background, no torch"}
    for row in rows.values():
        assert row["bundle"] == "demo" and row["runs"] == 1
        # the caption exists before the process ends, and the process is more than its interpreter
        assert 0 < row["interpreter_ms"] / 1e3 < row["caption_s"] <= row["exit_s"]
        assert 20 < row["peak_rss_mb"] < 4000
        steps = sum(row[f"{s}_ms"] for s in ("imports", "bundle", "make_source", "warm_up", "coverage", "source", "caption"))
        assert steps > 0 and row["bundle_ms"] >= row["manifest_ms"] > 0
    assert rows["off"]["coverage_ms"] < rows["on"]["coverage_ms"] or rows["on"]["coverage"] != "on"
    assert "| demo | off |" in (out / "startup.md").read_text()
    # loading the scorer in the background: the first caption goes out unscored, without waiting
    assert rows["background, no torch"]["coverage_on"] is False
    assert rows["on"]["coverage_on"] is True or rows["on"]["coverage"].endswith("(off: no edgecap[nlp])")


def test_startup_with_bad_arguments_gives_the_clis_one_line_errors(tmp_path):
    """--out FILE and --workdir FILE were tracebacks; --bundles , wrote an empty result with exit 0."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    for argv, line in ((["--out", notes], f"--out {notes} exists and is not a directory"),
                       (["--workdir", notes, "--out", tmp_path / "o"], f"--workdir {notes} exists and is not a directory"),
                       (["--bundles", ",", "--out", tmp_path / "o"], "--bundles names no bundle; choose from demo, real")):
        done = subprocess.run([sys.executable, f"{REPO}/benchmarks/startup.py", *map(str, argv)], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            f"startup.py: error: {line}; name a folder for the results (see startup.py --help)"
            if "exists" in line else f"startup.py: error: {line} (see startup.py --help)"], done.stderr
    assert notes.read_text() == "my notes" and not (tmp_path / "o").exists()


# -- benchmarks/log_read.py ------------------------------------------------------------------------
def test_log_read_benchmark_quick(tmp_path):
    pytest.importorskip("rosbags")
    pytest.importorskip("mcap_ros2")
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/log_read.py", "--quick",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    rows = json.loads((tmp_path / "log_read.json").read_text())["rows"]
    cells = {(r["storage"], r["message"], r["reader"]) for r in rows}
    assert ("rosbag2 sqlite3", "Image", "rosbags") in cells          # only rosbags reads SQLite3
    assert ("rosbag2 sqlite3", "Image", "mcap") not in cells
    assert ("rosbag2 sqlite3", "Image", "rosbags AnyReader") in cells  # the reader it replaced, beside it
    assert {("mcap file", "CompressedImage", r) for r in ("mcap", "rosbags")} <= cells
    assert all(r["ms_per_image"] > 0 and r["vs_fastest"] >= 1.0 for r in rows)
    assert "| rosbag2 mcap | Image | mcap |" in (tmp_path / "log_read.md").read_text()


# -- benchmarks/fleet.py ---------------------------------------------------------------------------
def test_fleet_benchmark_quick(tmp_path):
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    pytest.importorskip("mcap_ros2")
    pytest.importorskip("matplotlib")
    from tests._export_util import cnn_bundle

    bundle = cnn_bundle(tmp_path)
    run = subprocess.run([sys.executable, f"{REPO}/benchmarks/fleet.py", "--quick", "--bundle", str(bundle),
                          "--out", str(tmp_path / "results")], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((tmp_path / "results" / "fleet.json").read_text())
    rows = {r["configuration"]: r for r in result["rows"]}
    assert set(rows) == {"run, 1 thread", "fleet 1 actor x 1 thread"}
    assert all(r["status"] == "ok" and r["captions"] == 24 and r["captions_per_s"] > 0 for r in rows.values())
    fleet = rows["fleet 1 actor x 1 thread"]
    assert fleet["against"] == "run, 1 thread" and fleet["vs_run"] > 0 and fleet["per_actor_busy_s"] > 0
    assert "| fleet 1 actor x 1 thread |" in (tmp_path / "results" / "fleet.md").read_text()
    assert (tmp_path / "results" / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- benchmarks/gpu_check.py -----------------------------------------------------------------------
# a GPU machine has torch, onnx, onnxruntime-gpu, numpy, matplotlib: none of these
ABSENT_THERE = ("spacy", "open_clip", "faiss", "pycocoevalcap", "tensorrt", "torchvision")
# absent as a module that is not installed is: an import raises, importlib.util.find_spec says None
# (torch's dynamo asks find_spec about tensorrt and others when the FLOP counter imports it)
BLOCKED_RUN = f"""
import importlib.util, runpy, sys
ABSENT = {ABSENT_THERE!r}
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU machine)")
sys.meta_path.insert(0, Absent())
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, package=None: None if name.split(".")[0] in ABSENT else found(name, package)
sys.argv = ["gpu_check.py", *sys.argv[1:]]
runpy.run_path("{REPO}/benchmarks/gpu_check.py", run_name="__main__")
"""


def _run(*args, timeout=900):
    # one torch thread: on a shared machine torch's spinning OpenMP threads make a tiny decode 20x slower
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", BLOCKED_RUN, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def test_no_gpu_prints_one_line_and_exits_0(tmp_path):
    run = _run("--out", tmp_path / "gpu")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no GPU: onnxruntime "), run.stdout
    assert "CUDAExecutionProvider" in lines[0] and "docs/gpu.md" in lines[0]
    assert "CUDAExecutionProvider" in json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())["skipped"]


@pytest.mark.slow
def test_cpu_provider_as_device_runs_every_path_end_to_end(tmp_path):
    """--device cpu: the resident path on onnxruntime's CPU tensors, the PyTorch references on
    the CPU, the breakdown, the roofline and the goal table, on only the packages a GPU machine has."""
    out = tmp_path / "gpu"
    run = _run("--out", out, "--workdir", tmp_path / "bundles", "--device", "cpu", "--quick", "--batches", "1",
               "--beams", "1,2", "--precisions", "fp32,tf32,fp16", "--repeats", "1", "--cpu-repeats", "1",
               "--ref-repeats", "1", "--warmup", "0", "--inputs", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "gpu_check: fp32 tokens identical to the CPU provider" in run.stdout.splitlines()[-1]
    report = json.loads((out / "gpu_check.json").read_text())
    rows = {(r["model"], r["precision"], r["beam"], r["path"]): r for r in report["rows"]}
    fp32_paths = ("CPU provider", "resident", "torch")
    expected = {(m, "fp32", k, p) for m in ("m2", "demo") for k in (1, 2) for p in fp32_paths}
    expected |= {("m2", "fp32", k, "m2-official") for k in (1, 2)}  # the official code decodes M² only
    expected |= {(m, "fp16", k, "resident") for m in ("m2", "demo") for k in (1, 2)}  # tf32 is a GPU mode: dropped
    assert set(rows) == expected and not report["skipped"]
    for key, row in rows.items():
        assert row["ms"] > 0 and row["captions_per_s"] > 0 and row["captions_compared"] == 1, key
    for model in ("m2", "demo"):
        for beam in (1, 2):
            resident = rows[(model, "fp32", beam, "resident")]
            assert resident["identical"] == 1.0 and resident["providers"] == ["CPUExecutionProvider"]
            # where the time went: the device path's parts, per step, and the step against the roofline
            assert set(resident["per_step_ms"]) == {"step graph", "cache update", "top-k copy", "input copies",
                                                    "reorder", "host search"}
            assert resident["per_step_ms"]["step graph"] > 0 and resident["steps_per_decode"] >= 1
            assert resident["step_bound_ms"] > 0 and resident["x_step_bound"] > 0
            assert 0.0 <= rows[(model, "fp16", beam, "resident")]["identical"] <= 1.0
    assert report["rates"]["bandwidth"] > 0 and report["rates"]["flops"] > 0
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["fp32 tokens identical to the CPU provider"]["status"] == "met"
    assert goals["batch 1, beam 5: <= 15 ms per caption"]["status"] == "not measured"  # beam 5 was not run
    md = (out / "gpu_check.md").read_text()
    assert "| m2 | fp16 | 1 | 2 | resident |" in md and "| goal (issue 35) | status | measured |" in md
    assert "| m2 | fp32 | 1 | 2 | m2-official |" in md
    assert (out / "gpu_check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["tensorrt"] == "not run (--device cpu)"
    # a bundle given is run as it is, nothing exported
    assert not (out / "bundles").exists()
    bundle = next(p for p in (tmp_path / "bundles").iterdir() if p.name.startswith("m2-fp32"))
    run = _run("--out", tmp_path / "given", "--device", "cpu", "--bundle", bundle, "--beams", "2", "--repeats", "1",
               "--cpu-repeats", "1", "--inputs", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    given = json.loads((tmp_path / "given" / "gpu_check.json").read_text())
    assert [(r["model"], r["beam"], r["path"], r["identical"]) for r in given["rows"]] == [
        (bundle.name, 2, "CPU provider", 1.0), (bundle.name, 2, "resident", 1.0)]
    assert sorted(p.name for p in (tmp_path / "given").iterdir()) == ["gpu_check.json", "gpu_check.md", "gpu_check.png"]


def test_providers_take_onnxruntime_options(tmp_path):
    # gpu_check turns TF32 off as ("CUDAExecutionProvider", {"use_tf32": "0"}): a (name, options)
    # pair is checked by its name like a plain name
    from edgecap.errors import EdgecapError
    from edgecap.runtime.engines import check_providers

    assert check_providers([("CPUExecutionProvider", {}), "CPUExecutionProvider"])[0][0] == "CPUExecutionProvider"
    with pytest.raises(EdgecapError, match="unknown onnxruntime execution provider 'CUDAExecutionProviderX'"):
        check_providers([("CUDAExecutionProviderX", {"use_tf32": "0"})])


FP16_WITHOUT_ONNX_IR = r"""
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("onnx_ir", "onnxscript"):
            raise ModuleNotFoundError(f"No module named {name!r} (another onnx on the GPU machine)")
sys.meta_path.insert(0, Absent())
from pathlib import Path
from edgecap.export.quantize import convert_fp16
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
print(convert_fp16(src, dst))
"""


@pytest.mark.slow
def test_fp16_conversion_of_the_m2_step_needs_no_onnx_ir(tmp_path):
    """The M² fp16 bundle failed to convert on a GPU machine inside onnx-ir (SerdeError under its
    onnx 1.23): the conversion uses onnxruntime's tools only, here with onnx-ir unimportable, and
    the fp16 step still scores like the fp32 one."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from tests._export_util import export, save_tiny

    bundle = export(save_tiny(tmp_path / "m2.pt", "m2"), tmp_path / "m2").path
    src, dst = bundle / "decoder_step.onnx", tmp_path / "step-fp16.onnx"
    run = subprocess.run([sys.executable, "-c", FP16_WITHOUT_ONNX_IR, str(src), str(dst)], capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0 and run.stdout.strip() == "fp16", run.stderr[-2000:]
    onnx.checker.check_model(onnx.load(str(dst)), full_check=True)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in onnx.load(str(dst)).graph.initializer)
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (src, dst)]
    rng = np.random.default_rng(0)
    feeds = {}
    for t in sessions[0].get_inputs():
        shape = [int(d) for d in t.shape]
        if t.name == "token":
            feeds[t.name] = rng.integers(4, 20, shape).astype(np.int64)
        elif t.name == "step":
            feeds[t.name] = np.array(0, np.int64)
        elif t.type == "tensor(bool)":
            feeds[t.name] = np.ones(shape, bool)
        else:
            feeds[t.name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
    fp32, fp16 = (s.run(["logprobs"], feeds)[0] for s in sessions)
    assert fp16.dtype == np.float32 and np.abs(fp32 - fp16).max() < 0.05
