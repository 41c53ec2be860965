"""The bundle manifest: schema validation with field-naming errors, sha256 checks, and the
torch-free Bundle's refusals."""

import json
import shutil

import cv2
import numpy as np
import pytest
import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.manifest import (
    FORMAT_VERSION,
    ManifestError,
    ParityNotRun,
    ParityReport,
    load_manifest,
)
from edgecap.errors import EdgecapError
from edgecap.runtime.session import Bundle
from tests._export_util import BATCH, BEAM, export, save_tiny


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("manifest")
    return export(save_tiny(root / "updown.pt", "updown"), root / "bundle").path


@pytest.fixture
def copy(bundle_dir, tmp_path):
    dst = tmp_path / "b"
    shutil.copytree(bundle_dir, dst)
    return dst


def _edit(path, fn):
    data = json.loads((path / "manifest.json").read_text())
    fn(data)
    (path / "manifest.json").write_text(json.dumps(data))


def test_valid_bundle_loads_with_its_fields(bundle_dir):
    b = Bundle.load(bundle_dir)
    assert (b.batch_size, b.beam_size, b.max_len) == (BATCH, BEAM, 8)
    assert b.itos[b.bos_id] == "<bos>" and b.itos[b.eos_id] == "<eos>" and b.pad_id == 0
    assert not b.has_visual and b.preprocessing is None
    assert b.manifest.model.family == "updown"


def test_tampered_file_is_refused_by_sha256(copy):
    data = bytearray((copy / "encoder.onnx").read_bytes())
    data[-1] ^= 0xFF
    (copy / "encoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"encoder.onnx has sha256 .* \(modified after export"):
        Bundle.load(copy)


def test_missing_listed_file_is_refused(copy):
    (copy / "decoder_step.onnx").unlink()
    with pytest.raises(ManifestError, match="decoder_step.onnx is listed .* but missing"):
        load_manifest(copy)


@pytest.mark.parametrize("version, hint", [(FORMAT_VERSION + 1, "upgrade edgecap"), (FORMAT_VERSION - 1, "re-export"), (0, "re-export")])
def test_wrong_format_version_is_refused(copy, version, hint):
    _edit(copy, lambda d: d.update(format_version=version))
    with pytest.raises(ManifestError, match=f"format_version: {version}, this runtime reads version {FORMAT_VERSION} .*{hint}"):
        Bundle.load(copy)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.pop("vocab"), r"\.vocab: missing"),
    (lambda d: d.update(batch_size=True), r"\.batch_size: expected an integer"),
    (lambda d: d.update(batch_size=0), r"\.batch_size: 0, expected >= 1"),
    (lambda d: d["graphs"][1].update(file="../secret.onnx"), r"graphs\[1\]\.file: '../secret.onnx', expected a plain file name"),
    (lambda d: d["graphs"][0].update(sha256="abc"), r"graphs\[0\]\.sha256"),
    (lambda d: d["graphs"][0].update(engine="tflite"), r"graphs\[0\]\.engine: 'tflite', expected one of"),
    (lambda d: d["graphs"][0]["inputs"][0].update(shape=[-1, 6, 24]), r"graphs\[0\]\.inputs\[0\]\.shape\[0\]: -1, expected a static size"),
    (lambda d: d["vocab"].update(eos_id=999), r"vocab\.eos_id: 999 is outside the vocabulary"),
    (lambda d: d.update(format="something-else"), r"not an edgecap bundle"),
    (lambda d: d["graphs"][0].update(engine="tensorrt"), r"graphs\[0\]\.tensorrt: missing"),
    (lambda d: d.update(input="images"), r"preprocessing: missing"),
    # the records are typed to the leaf: model, parity, checks, versions, retrieval, frontend
    (lambda d: d["model"].pop("family"), r"\.model\.family: missing"),
    (lambda d: d["model"].update(parameters="many"), r"\.model\.parameters: expected an integer, got str"),
    (lambda d: d["parity"]["onnxruntime"].update(passed="yes"), r"\.parity\.onnxruntime\.passed: expected true/false"),
    (lambda d: d["parity"]["onnxruntime"]["max_abs_delta"].update(encoder="small"),
     r"\.parity\.onnxruntime\.max_abs_delta\.encoder: expected a number"),
    (lambda d: d["checks"]["encoder.onnx"].update(problems="none"), r"\.checks\.encoder\.onnx\.problems: expected a list"),
    (lambda d: d["versions"].update(python=3.11), r"\.versions\.python: expected a string, got float"),
    (lambda d: d["versions"].update({"tensorrt-rtx": 1.7}), r"\.versions\.tensorrt-rtx: expected a string, got float"),
    (lambda d: d["checks"]["encoder.onnx"].update(checked_by=3), r"\.checks\.encoder\.onnx\.checked_by: expected a string"),
    # engines that could not run at export: "ran": false and why, else the gate's full report
    (lambda d: d["parity"].update(tensorrt={"precision": "fp32", "ran": False}), r"\.parity\.tensorrt\.reason: missing"),
    (lambda d: d["parity"].update(tensorrt={"precision": "fp32", "reason": "no GPU"}), r"\.parity\.tensorrt\.inputs: missing"),
    (lambda d: d.update(frontend={"kind": "torchvision", "backbone": "resnet50"}), r"\.frontend\.weights: missing"),
    (lambda d: d.update(retrieval={"index": "/etc/index.faiss", "tokens": "t.npy", "k": 3, "length": 5, "dim": 24,
                                   "pad_id": 0, "sha256": {}}), r"\.retrieval\.index: '/etc/index.faiss' is not a path inside"),
])
def test_malformed_manifest_names_the_field(copy, edit, field):
    _edit(copy, edit)
    with pytest.raises(ManifestError, match=field):
        Bundle.load(copy)


def test_tensorrt_for_rtx_records_read_typed_and_write_back_as_written(copy):
    """What an export with TensorRT for RTX adds to the manifest (docs/bundle.md): a parity record
    of engines that could not run here, the parser that judged each graph and the distribution's
    version, under the JSON keys documented; read as typed records, written back unchanged."""
    reason = "engines need a supported GPU, and this machine has none"

    def add(d):
        d["parity"]["tensorrt"] = {"precision": "fp16", "ran": False, "reason": reason}
        d["checks"]["encoder.onnx"]["checked_by"] = "TensorRT for RTX 1.7.1.116's ONNX parser"
        d["versions"]["tensorrt-rtx"] = "1.7.1.116"

    _edit(copy, add)
    written = json.loads((copy / "manifest.json").read_text())
    m = load_manifest(copy)
    not_run, gate = m.parity["tensorrt"], m.parity["onnxruntime"]
    assert isinstance(not_run, ParityNotRun) and (not_run.ran, not_run.precision, not_run.reason) == (False, "fp16", reason)
    assert isinstance(gate, ParityReport) and gate.ran and gate.passed
    assert m.checks["encoder.onnx"].checked_by == "TensorRT for RTX 1.7.1.116's ONNX parser"
    assert m.versions.tensorrt_rtx == "1.7.1.116"
    assert m.to_dict() == written and "ran" not in m.to_dict()["parity"]["onnxruntime"]


def test_not_json_and_no_manifest(copy, tmp_path):
    (copy / "manifest.json").write_text("{oops")
    with pytest.raises(ManifestError, match=r"manifest\.json: invalid JSON at line 1: "):
        Bundle.load(copy)
    (copy / "manifest.json").write_bytes(b"{\n  \"format\": \"edgecap-bundle\",\n  \xff\n}")
    with pytest.raises(ManifestError, match=r"manifest\.json: not UTF-8 text \(byte 34\)"):
        Bundle.load(copy)
    with pytest.raises(ManifestError, match="has no manifest.json"):
        Bundle.load(tmp_path)


def test_a_manifest_saved_again_with_a_byte_order_mark_loads(copy):
    # Notepad / PowerShell write UTF-8 with a BOM, which json.loads refuses
    path = copy / "manifest.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert Bundle.load(copy).batch_size == BATCH


def test_unlisted_files_are_never_opened(copy):
    (copy / "evil.onnx").write_bytes(b"garbage")  # not in the manifest: ignored, load works
    assert Bundle.load(copy).batch_size == BATCH


def test_static_batch_and_beam_range_are_enforced(bundle_dir):
    b = Bundle.load(bundle_dir)
    feats = np.zeros((BATCH + 1, 6, 24), np.float32)
    with pytest.raises(EdgecapError, match=r"input 'features' has shape \[3, 6, 24\], the graph was exported for \[2, 6, 24\]"):
        b.encode(feats, np.ones((BATCH + 1, 6), bool))
    cross = b.encode(np.zeros((BATCH, 6, 24), np.float32), np.ones((BATCH, 6), bool))
    with pytest.raises(EdgecapError, match="beams 1..2"):
        b.decode(cross, DecodeOptions(beam_size=3, max_len=8))
    with pytest.raises(EdgecapError, match="static cache length 8"):
        b.decode(cross, DecodeOptions(beam_size=1, max_len=9))
    with pytest.raises(EdgecapError, match="no visual graph"):
        b.visual(np.zeros((BATCH, 3, 16, 16), np.float32))


def test_greedy_on_the_beam_graph_equals_its_own_first_rows(bundle_dir):
    """beam 1 decodes on the batch*beam graph: the unused rows must not change the result."""
    b = Bundle.load(bundle_dir)
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((BATCH, 6, 24)).astype(np.float32)
    mask = np.ones((BATCH, 6), bool)
    mask[1, 3:] = False
    cross = b.encode(feats, mask)
    greedy = b.decode(cross, DecodeOptions(beam_size=1, max_len=8))
    # decode each image on its own (the other row a copy) and compare
    for i in range(BATCH):
        idx = [i] * BATCH
        alone = b.decode(b.encode(feats[idx], mask[idx]), DecodeOptions(beam_size=1, max_len=8))
        assert np.array_equal(alone.tokens[0], greedy.tokens[i])


def test_tensorrt_engine_requested_but_absent(bundle_dir):
    with pytest.raises(EdgecapError, match="has no TensorRT engines"):
        Bundle.load(bundle_dir, engine="tensorrt")


@pytest.mark.parametrize("role", ["encoder", "decoder_step"])
def test_a_foreign_graph_with_a_re_recorded_hash_is_refused_at_load(copy, tmp_path, role, run_cli):
    """Someone swapped in another export's graph and fixed up the sha256: the hash passes,
    the graph's declared inputs do not."""
    from edgecap.io import sha256_file

    other = export(save_tiny(tmp_path / "smart.pt", "smart", n_regions=10), tmp_path / "other").path
    shutil.copy(other / f"{role}.onnx", copy / f"{role}.onnx")

    def rehash(data):
        entry = next(g for g in data["graphs"] if g["role"] == role)
        entry["sha256"] = sha256_file(copy / f"{role}.onnx")
    _edit(copy, rehash)
    with pytest.raises(ManifestError, match=rf"{role}.onnx: .*the file does not belong to this bundle") as exc:
        Bundle.load(copy)
    assert "\n" not in str(exc.value)
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.zeros((16, 16, 3), np.uint8))
    code, stdout, stderr = run_cli("run", copy, "--source", images)  # what a user sees
    assert (code, stdout) == (1, "") and stderr.count("\n") == 1
    assert f"{role}.onnx: " in stderr and "the file does not belong to this bundle" in stderr
