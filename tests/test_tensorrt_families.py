"""Every family's bundle builds real TensorRT engines, at fp32 and fp16.

TensorRT for RTX (the trt-rtx extra) builds without a GPU, so these run on every CI machine; with
full TensorRT installed (a GPU machine) they build with it instead. An engine's bindings are
checked against its manifest entry: at build time on the network TensorRT parsed (the export
refuses a mismatch), here again on that network, and on the deserialised engine where a
supported GPU can load it.
"""

import pytest

from edgecap.contract.manifest import load_manifest
from edgecap.models import list_models
from tests._export_util import export, save_tiny
from tests.tensorrt_helpers import engines_run_here, needs_builder, needs_gpu, parsed_bindings

FAMILIES = list_models()
PRECISIONS = ("fp32", "fp16")  # every family exports an fp16 graph (quantize.convert_fp16)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-families")
    made = {}

    def make(name, precision):
        if (name, precision) not in made:
            ckpt = root / f"{name}.pt"
            if not ckpt.exists():
                save_tiny(ckpt, name)
            made[name, precision] = export(ckpt, root / f"{name}-{precision}", engine="trt", precision=precision,
                                           samples=1).path
        return made[name, precision]

    return make


@needs_builder
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_builds_engines_whose_bindings_are_the_manifests(bundles, name, precision):
    from edgecap.runtime.tensorrt_dist import available

    path = bundles(name, precision)
    m = load_manifest(path)
    dist = available()
    graphs = {g.role: g for g in m.graphs if g.engine == "onnxruntime"}
    engines = {g.role: g for g in m.graphs if g.engine == "tensorrt"}
    assert set(engines) == set(graphs) and "cache_update" in engines, (name, precision)
    for role, engine in engines.items():
        info = engine.tensorrt
        # the cache_update graph only moves the fp32 cache: an fp32 engine at every precision
        assert engine.precision == ("fp32" if role == "cache_update" else precision)
        assert engine.source == graphs[role].file and engine.precision == graphs[role].precision
        assert info.distribution == dist.name and info.version and info.compute_capabilities
        assert (path / engine.file).stat().st_size > 1000  # a serialised plan, not a stand-in
        # the bindings TensorRT built the engine with are the tensors the manifest lists
        assert parsed_bindings(path / engine.source, dist) == {
            **{t.name: ("input", t.dtype, t.shape) for t in engine.inputs},
            **{t.name: ("output", t.dtype, t.shape) for t in engine.outputs}}
    assert all(c.tensorrt_compatible and "ONNX parser" in c.checked_by for c in m.checks.values()), m.checks
    parity = m.parity["tensorrt"]
    assert parity.precision == precision
    if engines_run_here(dist):
        assert parity.ran and parity.passed
    else:
        assert not parity.ran and "engines need a supported GPU" in parity.reason


@needs_gpu
def test_every_familys_engines_load_and_caption_on_a_supported_gpu(bundles):
    """On a GPU TensorRT for RTX runs (Ampere, Ada, Blackwell), or with full TensorRT: the
    deserialised engines' bindings match the manifest (checked as they load), and they caption."""
    from edgecap.export.rebuild import random_model_inputs
    from edgecap.runtime.session import Bundle

    for name in FAMILIES:
        b = Bundle.load(bundles(name, "fp32"), engine="tensorrt")
        assert b.engine == "tensorrt"
        (feats, mask), extra = random_model_inputs(b.manifest)
        assert len(b.captions(b.decode(b.encode(feats, mask, *extra)))) == b.batch_size, name
