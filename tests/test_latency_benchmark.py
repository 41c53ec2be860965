"""benchmarks/latency.py --quick keeps working: table, CSV, JSON and plots are written."""

import json
import subprocess
import sys

from tests.conftest import REPO


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
