"""The fused-attention experiment of benchmarks/ort_settings.py (`--fused-attention`) compares
the exported step graph with rewrites that must decode the same captions: otherwise its timings
would compare different computations."""

import json
import shutil
import sys

import numpy as np
import pytest

from tests._export_util import export, save_tiny
from tests.conftest import REPO

pytest.importorskip("onnx")
sys.path.insert(0, f"{REPO}/benchmarks")


def _fused_copy(plain, out, **options):
    import onnx
    from _fused_attention import fuse_attention

    from edgecap.io import sha256_file

    shutil.copytree(plain, out)
    blocks = {}
    for role in ("decoder_step", "encoder"):
        model, counts = fuse_attention(onnx.load(str(out / f"{role}.onnx")), **options)
        onnx.save(model, str(out / f"{role}.onnx"))
        blocks[role] = dict(counts)
    manifest = json.loads((out / "manifest.json").read_text())
    for graph in manifest["graphs"]:
        graph["sha256"] = sha256_file(out / graph["file"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    return blocks


@pytest.mark.parametrize("family", ["smart", "m2"])
def test_fused_attention_rewrite_decodes_the_same_captions(tmp_path, family):
    import onnx

    from edgecap.contract.beam import DecodeOptions
    from edgecap.runtime.session import Bundle

    plain = tmp_path / "plain"
    export(save_tiny(tmp_path / f"{family}.pt", family), plain)
    fused = tmp_path / "fused"
    blocks = _fused_copy(plain, fused)
    assert blocks["decoder_step"].get("self_step", 0) > 0, blocks
    ops = {n.domain for n in onnx.load(str(fused / "decoder_step.onnx")).graph.node}
    assert "com.microsoft" in ops

    a, b = Bundle.load(plain), Bundle.load(fused)
    encoder = a.manifest.graph("encoder")
    rng = np.random.default_rng(1)
    for trial in range(2):
        feats = rng.standard_normal(encoder.inputs[0].shape).astype(np.float32)
        mask = np.ones(encoder.inputs[1].shape, bool)
        mask[..., -2:] = trial == 0
        cross_a, cross_b = a.encode(feats, mask), b.encode(feats, mask)
        for x, y in zip(cross_a, cross_b, strict=True):
            np.testing.assert_allclose(y.astype(np.float32), x.astype(np.float32), atol=1e-4)
        for beam in (1, 2):
            options = DecodeOptions(beam_size=beam, max_len=a.max_len)
            plain_hyp, fused_hyp = a.decode(cross_a, options), b.decode(cross_b, options)
            assert b.captions(fused_hyp) == a.captions(plain_hyp)
            np.testing.assert_array_equal(fused_hyp.tokens, plain_hyp.tokens)
            np.testing.assert_allclose(fused_hyp.scores, plain_hyp.scores, atol=1e-3)


@pytest.mark.parametrize("family", ["smart", "m2"])
def test_every_fused_variant_computes_the_exported_step(tmp_path, family):
    """The kernel-layout variants (`-bnsh`) take the key caches untransposed ([..., T, dh]);
    fed the same keys in that layout, each variant's step gives the exported step's log-probs."""
    import onnx
    import onnxruntime as ort
    from _fused_attention import fuse_attention
    from ort_settings import ATTENTION_VARIANTS

    plain = tmp_path / "plain"
    export(save_tiny(tmp_path / f"{family}.pt", family), plain)
    step_graph = plain / "decoder_step.onnx"
    reference = ort.InferenceSession(str(step_graph), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in reference.get_inputs():
        if spec.name == "step":
            feeds[spec.name] = np.array(3, np.int64)  # three slots written, the rest hidden
        elif spec.type == "tensor(int64)":
            feeds[spec.name] = rng.integers(4, 30, spec.shape).astype(np.int64)
        elif spec.type == "tensor(bool)":
            feeds[spec.name] = np.ones(spec.shape, bool)
        else:
            feeds[spec.name] = rng.standard_normal(spec.shape).astype(np.float32)
    expected = reference.run(["logprobs"], feeds)[0]
    for name, options in ATTENTION_VARIANTS.items():
        fused, counts = fuse_attention(onnx.load(str(step_graph)), **options)
        assert counts, name
        path = tmp_path / f"{name}.onnx"
        onnx.save(fused, str(path))
        variant_feeds = {k: np.ascontiguousarray(np.swapaxes(v, -1, -2))
                         if options.get("bnsh") and k.startswith(("self_k", "cross_k")) else v
                         for k, v in feeds.items()}
        got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logprobs"], variant_feeds)[0]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=name)
