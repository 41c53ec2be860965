"""`edgecap export`: presets, the printed run command, int8 parity, and every refusal.

`edgecap export DIR` on a directory that is not a bundle says what the directory is (it used to
say "DIR is a bundle" of a folder of notes).
"""

import json
import shlex
from pathlib import Path

import pytest
import torch

from edgecap.contract.manifest import FORMAT_VERSION, load_manifest
from edgecap.export.specs.transformer import TransformerSpec
from tests._export_util import save_tiny


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    torch.set_num_threads(1)
    return save_tiny(tmp_path_factory.mktemp("ckpt") / "smart.pt", "smart")


def _one_line_error(code, err, *needles):
    assert code == 1, err
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _no_leftovers(parent: Path, name: str):
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.")]


def test_target_preset_exports_and_prints_the_run_command(run_cli, ckpt, tmp_path):
    out = tmp_path / "bundle"
    code, stdout, err = run_cli("export", ckpt, "--target", "cpu-ort-fp32", "--out", out, "--samples", 2, "--quiet")
    assert code == 0, err
    m = load_manifest(out)
    assert m.target == "cpu-ort-fp32" and m.batch_size == 1 and m.beam_size == 3
    assert m.parity["onnxruntime"].passed
    assert "parity onnxruntime fp32: greedy 100%; beam 100% identical on 2 inputs" in stdout
    assert f"Bundle.load({str(out)!r})" in stdout  # a features bundle: how to load it
    # the command-line beats the preset
    code, _, err = run_cli("export", ckpt, "--target", "cpu-ort-fp32", "--beam", 2, "--out", out, "--force",
                           "--samples", 2, "--quiet")
    assert code == 0, err
    assert load_manifest(out).beam_size == 2


def test_image_bundle_prints_edgecap_run(run_cli, tmp_path):
    ckpt = save_tiny(tmp_path / "cnn.pt", "smart-nomem", visual={"kind": "cnn", "image_size": 16, "channels": [8, 24]},
                     n_regions=16)
    out = tmp_path / "robot bundles" / "cnn-bündle"  # the printed command pastes into a shell as it is
    code, stdout, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 1, "--quiet")
    assert code == 0, err
    run_it = next(line for line in stdout.splitlines() if line.startswith("run it: "))
    assert shlex.split(run_it.split("   (")[0])[2:] == ["edgecap", "run", str(out), "--source", "0"]
    assert load_manifest(out).preprocessing.size == 16


def test_int8_export_reports_its_parity(run_cli, ckpt, tmp_path):
    out = tmp_path / "int8"
    code, stdout, err = run_cli("export", ckpt, "--target", "cpu-ort-int8", "--out", out, "--samples", 2, "--quiet")
    assert code == 0, err
    m = load_manifest(out)
    report = m.parity["onnxruntime"]
    assert report.precision == "int8"
    for key in ("greedy_identical", "beam_identical", "cider_delta", "cider_pytorch", "cider_bundle"):
        assert getattr(report, key) is not None
    assert 0.0 <= report.beam_identical <= 1.0
    assert report.max_abs_delta["decoder_step"] > 0  # really quantised
    # every graph quantised but the cache_update graph, which only moves the fp32 cache
    assert {(g.role == "cache_update", g.precision) for g in m.graphs} == {(False, "int8"), (True, "fp32")}
    assert "parity onnxruntime int8" in stdout


def _linear_layers(path: Path) -> list:
    """The MatMul / Gemm nodes of an fp32 graph whose weight is a 2-D initialiser."""
    import onnx

    graph = onnx.load(str(path)).graph
    weights = {t.name for t in graph.initializer if len(t.dims) == 2}
    return [n for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]


def _slots_stay_float(encoder: Path) -> bool:
    import onnx

    slots = [t for t in onnx.load(str(encoder)).graph.initializer if len(t.dims) == 4]
    return bool(slots) and all(t.data_type == onnx.TensorProto.FLOAT for t in slots)


@pytest.mark.parametrize("family", ["smart", "updown"])
def test_dynamic_int8_quantizes_linear_layers_per_output_column(ckpt, tmp_path, family):
    # One scale per output column of each linear weight (a per-tensor scale cost the trained
    # demo model 8 points of caption agreement); the memory slots' per-head K/V stay float,
    # which onnxruntime's per-column kernels could not run. Up-Down's step exports its linear
    # layers as Gemm, which the dynamic quantizer used to leave in fp32 (1 of 7 in int8).
    import onnx
    from onnx import numpy_helper

    from tests._export_util import export

    if family != "smart":
        ckpt = save_tiny(tmp_path / f"{family}.pt", family)
    fp32 = export(ckpt, tmp_path / "fp32")
    result = export(ckpt, tmp_path / "pc", precision="int8")
    assert result.parity["onnxruntime"].precision == "int8"
    for role in ("encoder", "decoder_step"):
        graph = onnx.load(str(result.path / f"{role}.onnx")).graph
        init = {t.name: t for t in graph.initializer}
        quantized = [n for n in graph.node if n.op_type == "MatMulInteger"]
        # every linear layer, including those the exporter wrote as Gemm (a 2-D input: the
        # decoder step's rows), which onnxruntime's dynamic quantizer leaves in fp32
        linear = _linear_layers(fp32.path / f"{role}.onnx")
        assert len(quantized) == len(linear), (role, [n.op_type for n in linear])
        assert not [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in init
                    and len(init[n.input[1]].dims) == 2], role
        for node in quantized:
            weight = init[node.input[1]]
            scale = numpy_helper.to_array(init[node.input[1].removesuffix("_quantized") + "_scale"])
            assert weight.data_type == onnx.TensorProto.INT8 and len(weight.dims) == 2
            assert scale.shape == (weight.dims[1],), node.name
    assert _slots_stay_float(result.path / "encoder.onnx") or family != "smart"


def test_static_int8_writes_qdq_graphs(ckpt, tmp_path):
    import onnx

    from tests._export_util import export

    result = export(ckpt, tmp_path / "qdq", precision="int8", quantize="static")
    ops = {n.op_type for n in onnx.load(str(result.path / "decoder_step.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert result.parity["onnxruntime"].precision == "int8"


def test_weight_only_int8_writes_matmulnbits_that_tensorrt_refuses(run_cli, ckpt, tmp_path):
    # onnxruntime's weight-only kernel in the decoder step: every linear layer's weight in 8 bits
    # with one scale per block of input rows, activations quantized inside the kernel (accuracy
    # level 4); the encoder dynamic int8, its memory slots fp32. TensorRT cannot parse the
    # contrib op: the manifest's checks say so, and rebuilding engines from such a bundle is
    # refused naming it.
    import onnx
    from onnx import helper

    from tests._export_util import export

    fp32 = export(ckpt, tmp_path / "fp32")
    out = tmp_path / "wonly"
    code, stdout, err = run_cli("export", ckpt, "--target", "cpu-ort-int8-greedy", "--samples", 2, "--out", out,
                                "--quiet")
    assert code == 0, err
    m = load_manifest(out)
    assert (m.target, m.batch_size, m.beam_size) == ("cpu-ort-int8-greedy", 1, 1)  # one decoder row
    report = m.parity["onnxruntime"]
    assert report.precision == "int8" and report.quantize == "weight-only" and report.passed
    assert report.max_abs_delta["decoder_step"] > 0  # really quantised
    assert 0.0 <= report.greedy_identical <= 1.0 and report.cider_delta is not None
    assert "parity onnxruntime int8: greedy" in stdout
    # every graph quantised but the cache_update graph, which only moves the fp32 cache
    assert {(g.role == "cache_update", g.precision) for g in m.graphs} == {(False, "int8"), (True, "fp32")}
    step = onnx.load(str(out / "decoder_step.onnx")).graph
    nbits = [n for n in step.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == len(_linear_layers(fp32.path / "decoder_step.onnx")) > 0
    assert not [n for n in step.node if n.op_type in ("MatMulInteger", "DynamicQuantizeLinear")]
    for node in nbits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert node.domain == "com.microsoft" and (attrs["bits"], attrs["accuracy_level"]) == (8, 4), attrs
    check = m.checks["decoder_step.onnx"]
    # judged by TensorRT's own parser where one imports (edgecap's op list elsewhere), with the hint
    assert not check.tensorrt_compatible and "MatMulNBits" in check.problems[0], check
    assert "weight-only" in check.problems[0] and check.checked_by, check
    # the encoder runs on every region at once, where dynamic int8 is the faster int8
    encoder = onnx.load(str(out / "encoder.onnx")).graph
    assert len([n for n in encoder.node if n.op_type == "MatMulInteger"]) == len(_linear_layers(fp32.path / "encoder.onnx"))
    assert not [n for n in encoder.node if n.op_type == "MatMulNBits"]
    assert _slots_stay_float(out / "encoder.onnx")

    code, _, err = run_cli("export", out, "--engine", "trt", "--force")
    _one_line_error(code, err, "not TensorRT-compatible", "decoder_step.onnx: ", "MatMulNBits",
                    "weight-only", "export the checkpoint with --engine trt")
    assert load_manifest(out).parity == m.parity  # the bundle is left as it was
    # a dynamic int8 bundle's integer MatMuls are no TensorRT ops either
    dynamic = export(ckpt, tmp_path / "dynamic", precision="int8")
    code, _, err = run_cli("export", dynamic.path, "--engine", "trt", "--force")
    _one_line_error(code, err, "not TensorRT-compatible", "encoder.onnx: ", "DynamicQuantizeLinear")


@pytest.mark.parametrize("family", ["updown", "m2"])
def test_weight_only_int8_takes_every_linear_layer_of_the_step(tmp_path, family):
    # Up-Down's step writes its linear layers as Gemm (unfolded first, as for dynamic int8);
    # M²'s meshed cross-attention gates are linear layers too
    import onnx

    from tests._export_util import export

    ckpt = save_tiny(tmp_path / f"{family}.pt", family)
    fp32 = export(ckpt, tmp_path / "fp32")
    result = export(ckpt, tmp_path / "wonly", precision="int8", quantize="weight-only")
    assert result.parity["onnxruntime"].quantize == "weight-only"
    ops = [n.op_type for n in onnx.load(str(result.path / "decoder_step.onnx")).graph.node]
    assert ops.count("MatMulNBits") == len(_linear_layers(fp32.path / "decoder_step.onnx")) > 0
    assert "Gemm" not in ops


@pytest.mark.slow
def test_weight_only_int8_demo_model_captions_frames_as_fp32_does(run_cli, tmp_path):
    # the trained demo model (peaked distributions, unlike a random tiny model): through
    # edgecap.runtime the weight-only bundle captions fresh frames of its world as the fp32
    # bundle does (98% / 98% greedy / beam 3 on 50 scenes in benchmarks/README.md)
    from edgecap.data.synth.world import TabletopWorld
    from edgecap.runtime.captioner import Captioner

    demo = Path(__file__).resolve().parents[1] / "edgecap" / "assets" / "demo-smart.pt"
    torch.set_num_threads(1)
    captions = {}
    for precision, quantize in (("fp32", ()), ("int8", ("--quantize", "weight-only"))):
        out = tmp_path / precision
        code, _, err = run_cli("export", demo, "--engine", "onnx", "--precision", precision, *quantize,
                               "--beam", 3, "--samples", 8, "--out", out, "--quiet")
        assert code == 0, err
        report = load_manifest(out).parity["onnxruntime"]
        assert report.greedy_identical >= 0.75 and report.beam_identical >= 0.75, report
        assert "synthetic world" in report.inputs and not report.random_inputs
        # the CNN has no linear layer for weight-only: static int8 where it pays (edgecap.export.front_int8)
        visual = load_manifest(out).graph("visual").precision
        assert visual == (report.front_end_int8.precision if precision == "int8" else "fp32")
        captioner = Captioner.from_bundle(out, threads=1)
        world = TabletopWorld(seed=101, size=captioner.size)
        frames = [world.render_frame(i * world.scene_frames)[0] for i in range(8)]  # eight scenes
        captions[precision] = [c.text for c in captioner.caption(frames)]
    assert all(captions["int8"]), captions
    same = sum(a == b for a, b in zip(captions["fp32"], captions["int8"], strict=True))
    assert same >= 6, captions


def test_existing_bundle_is_refused_without_force(run_cli, ckpt, tmp_path):
    out = tmp_path / "b"
    assert run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 1, "--quiet")[0] == 0
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out)
    _one_line_error(code, err, "already exists", "--force")
    load_manifest(out)


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_user_directory_is_never_replaced(run_cli, ckpt, tmp_path, force):
    out = tmp_path / "taken"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "data.csv").write_text("1,2")
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, *force)
    _one_line_error(code, err, str(out), "not an edgecap bundle", "2 files: notes.txt, sub/data.csv")
    assert (out / "notes.txt").read_text() == "mine" and (out / "sub" / "data.csv").read_text() == "1,2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_force_refuses_a_bundle_holding_user_files(run_cli, ckpt, tmp_path):
    out = tmp_path / "b"
    assert run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 1, "--quiet")[0] == 0
    (out / "notes.txt").write_text("mine")
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--force", "--samples", 1)
    _one_line_error(code, err, "is an edgecap bundle but also holds", "notes.txt")
    assert (out / "notes.txt").read_text() == "mine"


def test_force_will_not_turn_another_edgecap_directory_into_a_bundle(run_cli, ckpt, tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    (world / "synth.json").write_text(json.dumps({"generator": "edgecap.data.synth"}))
    (world / "dataset_coco.json").write_text("{}")
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", world, "--force")
    _one_line_error(code, err, "is an edgecap synthetic world, not a bundle")
    assert (world / "dataset_coco.json").is_file()


def test_force_replaces_an_empty_directory(run_cli, ckpt, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 1, "--quiet")
    assert code == 0, err
    load_manifest(out)


def test_corrupt_checkpoint_is_refused(run_cli, tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint at all")
    code, _, err = run_cli("export", bad, "--engine", "onnx", "--out", tmp_path / "b")
    _one_line_error(code, err, "bad.pt")
    _no_leftovers(tmp_path, "b")


def test_unwritable_out_dir_is_refused(run_cli, ckpt, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", blocker / "bundle")
    _one_line_error(code, err, f"--out {blocker / 'bundle'}", "is a file, not a directory")
    if Path("/proc").is_dir():  # root passes os.access on /proc; creating a file there fails
        code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", "/proc/edgecap-out")
        _one_line_error(code, err, "--out /proc/edgecap-out: cannot create files in /proc")


@pytest.mark.parametrize("argv, needles", [
    (["--engine", "onnx", "--opset", "9"], ["--opset 9", "17, 18, 19, 20"]),
    (["--engine", "onnx", "--workspace", "256"], ["does not take --workspace", "it takes:", "--quantize"]),
    (["--engine", "trt", "--quantize", "static"], ["does not take --quantize", "--workspace"]),
    (["--engine", "onx"], ["unknown engine 'onx'", "did you mean 'onnx'"]),
    (["--target", "cpu-ort-fp33"], ["unknown target", "did you mean 'cpu-ort-fp32'"]),
    (["--target", "cpu-ort-fp32", "--engine", "trt"], ["contradicts target"]),
    (["--engine", "onnx", "--precision", "int4"], ["--precision 'int4'", "fp32, fp16, int8"]),
    (["--engine", "onnx", "--exporter", "dynamo"], ["--opset 18"]),
    ([], ["choose an engine"]),
])
def test_bad_arguments_are_refused_in_one_line(run_cli, ckpt, tmp_path, argv, needles):
    code, _, err = run_cli("export", ckpt, *argv, "--out", tmp_path / "b")
    _one_line_error(code, err, *needles)
    _no_leftovers(tmp_path, "b")


def test_failed_parity_leaves_no_bundle(run_cli, ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(TransformerSpec, "step_atol", -1.0)  # no export can meet this
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", tmp_path / "b", "--samples", 1, "--quiet")
    _one_line_error(code, err, "parity gate failed", "decoder_step")
    _no_leftovers(tmp_path, "b")


def test_failed_export_with_force_keeps_the_old_bundle(run_cli, ckpt, tmp_path, monkeypatch):
    out = tmp_path / "b"
    assert run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--samples", 1, "--quiet")[0] == 0
    before = (out / "manifest.json").read_text()
    monkeypatch.setattr(TransformerSpec, "step_atol", -1.0)
    code, _, err = run_cli("export", ckpt, "--engine", "onnx", "--out", out, "--force", "--samples", 1, "--quiet")
    assert code == 1
    assert (out / "manifest.json").read_text() == before


def test_trt_without_tensorrt_is_one_line(run_cli, ckpt, tmp_path, monkeypatch):
    from edgecap.runtime import tensorrt_dist

    monkeypatch.setattr(tensorrt_dist, "installed", lambda dist: False)  # a machine with neither TensorRT
    code, _, err = run_cli("export", ckpt, "--engine", "trt", "--out", tmp_path / "b")
    _one_line_error(code, err, "no TensorRT is installed (--engine trt)", "edgecap[trt]", "edgecap[trt-rtx]")
    _no_leftovers(tmp_path, "b")


def test_preset_files_parse_and_cover_both_engines():
    from edgecap.export.formats import list_presets, load_preset

    presets = list_presets()
    assert {"cpu-ort-fp32", "cpu-ort-int8", "cpu-ort-int8-greedy", "jetson-orin-trt-fp16"} <= set(presets)
    engines = {load_preset(name)[1]["engine"] for name in presets}
    assert engines == {"onnx", "trt"}


def test_manifest_is_plain_json_with_versions(ckpt, tmp_path):
    from tests._export_util import export

    result = export(ckpt, tmp_path / "b")
    data = json.loads((result.path / "manifest.json").read_text())
    assert data["format"] == "edgecap-bundle" and data["format_version"] == FORMAT_VERSION
    assert {"torch", "onnx", "onnxruntime", "python"} <= set(data["versions"])
    assert sorted(p.name for p in result.path.iterdir()) == ["cache_update.onnx", "coverage_vectors.npz",
                                                              "decoder_step.onnx", "encoder.onnx", "manifest.json"]


def test_updown_lstm_step_quantizes_to_int8(tmp_path):
    # The exporter annotates LSTM gate tensors with shapes onnxruntime's quantizer disagrees
    # with; quantization must still work and leave no scratch file in the bundle.
    from tests._export_util import export

    ckpt = save_tiny(tmp_path / "updown.pt", "updown")
    result = export(ckpt, tmp_path / "u8", precision="int8")
    assert result.parity["onnxruntime"].precision == "int8"
    assert sorted(p.name for p in (tmp_path / "u8").iterdir()) == ["cache_update.onnx", "coverage_vectors.npz",
                                                                    "decoder_step.onnx", "encoder.onnx", "manifest.json"]


# -- a directory that is not a bundle --------------------------------------------------------------
@pytest.mark.parametrize("engine", ["onnx", "trt"])
def test_export_of_a_folder_of_notes_says_it_is_not_a_bundle(tmp_path, run_cli, engine):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("calibrate the camera\n")
    code, stdout, err = run_cli("export", notes, "--engine", engine)
    assert (code, stdout) == (1, "")
    assert err.strip().splitlines() == [
        f"edgecap export: error: {notes} is a directory, not an edgecap bundle (no manifest.json of ours); "
        "export takes a checkpoint file (.pt), or a bundle to rebuild its TensorRT engines"]
    assert [p.name for p in notes.iterdir()] == ["todo.txt"]


def test_export_of_a_retrieval_index_names_it(tmp_path, run_cli):
    index = tmp_path / "idx"
    index.mkdir()
    (index / "index.json").write_text(json.dumps({"format": "edgecap-retrieval-index"}))
    code, _, err = run_cli("export", index, "--engine", "onnx")
    assert code == 1
    assert f"{index} is an edgecap retrieval index, not a bundle;" in err
