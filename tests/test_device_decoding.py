"""Decoding with the state on the device (runtime/steppers.py `DeviceStepper`), run on
onnxruntime's CPU provider: OrtValues bound once, the bundle's cache_update graph writing the new
slots and reordering the beams, two cache copies in turn. Its captions must be today's, token for
token, for every family, greedy and beam, including batches whose rows end at different steps."""

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch

from edgecap.contract.beam import DecodeOptions
from edgecap.contract.manifest import ManifestError, load_manifest
from edgecap.errors import EdgecapError
from edgecap.export.specs import spec_for
from edgecap.models import list_models
from edgecap.models.checkpoint import save_checkpoint
from edgecap.models.decoding import generate
from edgecap.runtime.session import Bundle
from edgecap.runtime.steppers import DeviceStepper, HostStepper
from tests._export_util import export, tiny_model, tiny_vocab

FAMILIES = list_models()
BATCH, BEAM, SEEDS = 3, 3, 4
CPU = ["CPUExecutionProvider"]


def batches(spec) -> list[tuple]:
    """SEEDS batches of (features, mask, *extra encoder inputs), torch, some regions masked."""
    out = []
    for seed in range(SEEDS):
        inputs = spec.random_inputs(BATCH, seed)
        out.append((*spec.features(inputs), *spec.split(inputs)[1]))
    return out


def _lengths(model, batch: tuple, beam: int) -> list[int]:
    feats, mask, *extra = batch
    hyp = generate(model, feats, mask, DecodeOptions(beam_size=beam, max_len=model.cfg.max_len),
                   **({"extra": tuple(extra)} if extra else {}))
    return [int(n) for n in hyp.lengths[:, 0]]


def ragged_model(name: str):
    """The tiny model of `name` with its EOS output row tilted towards a random direction, by the
    least amount (found here, with PyTorch) that makes the rows of some batch end at different
    steps, greedy and beam alike: a random tiny model otherwise ends every caption at the same
    step, and the search's handling of finished rows would go untested."""
    model = tiny_model(name)
    eos = model.cfg.eos_id
    base = model.fc.weight.data[eos].clone()
    direction = torch.randn(base.shape, generator=torch.Generator().manual_seed(5)) / base.numel() ** 0.5
    inputs = batches(spec_for(model, BATCH, BEAM))
    for tilt in np.arange(0.0, 3.01, 0.1):
        model.fc.weight.data[eos] = base + float(tilt) * direction
        with torch.no_grad():
            ragged = [any(len(set(_lengths(model, batch, beam))) > 1 for batch in inputs) for beam in (1, BEAM)]
        if all(ragged):
            return model, [tuple(x.numpy() for x in batch) for batch in inputs]
    raise AssertionError(f"{name}: no tilt of the EOS row gives rows that end at different steps")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("device-decoding")
    out = {}
    for name in FAMILIES:
        model, inputs = ragged_model(name)
        ckpt = save_checkpoint(root / f"{name}.pt", model, tiny_vocab(model.cfg.vocab_size))
        out[name] = (export(ckpt, root / f"{name}-bundle", batch=BATCH, beam=BEAM, samples=1).path, inputs)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_device_state_captions_exactly_as_the_host_path(bundles, name):
    path, inputs = bundles[name]
    host = Bundle.load(path, providers=CPU)
    device = Bundle.load(path, providers=CPU, device_state=True)
    assert not host.device_state and device.device_state
    ragged = {1: False, BEAM: False}
    for batch in inputs:
        for beam in (1, BEAM):
            options = DecodeOptions(beam_size=beam, max_len=host.max_len)
            want = host.decode(host.encode(*batch), options)
            # the encoder writing straight into the device's cross tensors, and numpy cross tensors
            for cross in (device.encode_for_decoding(*batch), device.encode(*batch)):
                got = device.decode(cross, options)
                assert (got.tokens == want.tokens).all() and (got.lengths == want.lengths).all()
                assert (got.scores == want.scores).all()  # the same graph on the same numbers: bit for bit
            ragged[beam] |= len(set(want.lengths[:, 0].tolist())) > 1
    assert isinstance(device._steppers[BEAM], DeviceStepper) and isinstance(host._steppers[BEAM], HostStepper)
    assert ragged == {1: True, BEAM: True}, "no batch had rows that end at different steps"


@pytest.mark.slow
def test_device_stepper_binds_once_and_reads_only_top_k(bundles):
    path, (first, second, *_) = bundles["m2"]
    bundle = Bundle.load(path, providers=CPU, device_state=True)
    options = DecodeOptions(beam_size=BEAM, max_len=bundle.max_len)
    bundle.decode(bundle.encode_for_decoding(*first), options)
    stepper = bundle._steppers[BEAM]
    assert isinstance(stepper, DeviceStepper)
    tensors = {"token": stepper.token, "step": stepper.step, "parent": stepper.parent, "logprobs": stepper.logprobs,
               "top_logprobs": stepper.top[0], "top_tokens": stepper.top[1],
               **{f"cache side {i} {n}": t for i, side in enumerate(stepper.sides) for n, t in side.items()},
               **{f"cross {n}": t for n, t in stepper.cross.tensors.items()}}
    allocated = {name: id(t) for name, t in tensors.items()}
    reads = []

    def recorded(name, read):
        def record():
            reads.append(name)
            return read()
        return record

    for name, tensor in tensors.items():  # every copy back to the host, recorded
        tensor.read = recorded(name, tensor.read)
    hyp = bundle.decode(bundle.encode_for_decoding(*second), options)
    assert bundle._steppers[BEAM] is stepper and {name: id(t) for name, t in tensors.items()} == allocated
    steps = int(hyp.lengths.max())  # the search stops once every row has ended
    assert reads == ["top_logprobs", "top_tokens"] * steps


@pytest.mark.slow
def test_tensors_written_and_read_by_copies_as_on_a_gpu_caption_the_same(bundles, monkeypatch):
    """On a GPU every tensor is an OrtValue in device memory, written with update_inplace and read
    with numpy(), never in place: the device stepper with tensors made that way on the CPU
    provider captions as the host path does."""
    from edgecap.runtime.engines import OrtGraph, OrtTensor

    path, inputs = bundles["pma"]
    host = Bundle.load(path, providers=CPU)
    monkeypatch.setattr(OrtGraph, "tensor", lambda self, shape, dtype: OrtTensor(shape, dtype, "cpu", in_place=False))
    device = Bundle.load(path, providers=CPU, device_state=True)
    for batch in inputs:
        for beam in (1, BEAM):
            options = DecodeOptions(beam_size=beam, max_len=host.max_len)
            want = host.decode(host.encode(*batch), options)
            got = device.decode(device.encode_for_decoding(*batch), options)
            assert (got.tokens == want.tokens).all() and (got.scores == want.scores).all()
    stepper = device._steppers[BEAM]
    assert stepper.token.host is None and all(t.host is None for t in stepper.sides[0].values())


@pytest.mark.slow
def test_every_binding_gets_its_own_cuda_graph(bundles, monkeypatch):
    """With CUDA graphs each bound run is captured under its own gpu_graph_id (onnxruntime
    reserves 0): one per ping-pong side, per graph, per beam size, so a captured graph is only
    ever replayed on the buffers it was captured with; runs outside a binding never capture (-1).
    The CPU provider ignores the ids, so the bookkeeping is checked here and the captions too."""
    from edgecap.runtime.engines import OrtGraph

    path, inputs = bundles["transformer"]
    real = OrtGraph.__init__

    def flagged(self, *args, cuda_graph=False, **kwargs):  # as a CUDA session opened for capture would be
        real(self, *args, **kwargs)
        self.cuda_graph = cuda_graph
        if cuda_graph:
            self._plain.add_run_config_entry("gpu_graph_id", "-1")

    monkeypatch.setattr(OrtGraph, "__init__", flagged)
    monkeypatch.setattr("edgecap.runtime.session._where_state_lives", lambda root, graphs, asked, cuda_graph: True)
    bundle = Bundle.load(path, providers=CPU, device_state=True, cuda_graph=True)
    host = Bundle.load(path, providers=CPU)
    ids = {}
    for beam in (BEAM, 1):
        options = DecodeOptions(beam_size=beam, max_len=bundle.max_len)
        got = bundle.decode(bundle.encode_for_decoding(*inputs[0]), options)
        assert (got.tokens == host.decode(host.encode(*inputs[0]), options).tokens).all()
        stepper = bundle._steppers[beam]
        ids[beam] = ([run.graph_id for run in stepper._steps], [run.graph_id for run in stepper._updates])
    assert ids == {BEAM: ([1, 2], [1, 2]), 1: ([3, 4], [3, 4])}
    assert bundle._graphs["encoder"].cuda_graph is False  # only the step and the update capture
    assert bundle._graphs["decoder_step"]._plain.get_run_config_entry("gpu_graph_id") == "-1"


@pytest.mark.slow
def test_cache_update_graph_writes_the_slot_then_gathers_the_parents(bundles):
    """The exported cache_update graph, run by onnxruntime itself, against numpy: slot `step` of
    every cache tensor replaced by its new slot, then rows taken from their parents."""
    path = bundles["acf"][0]
    m = load_manifest(path)
    session = ort.InferenceSession(str(path / m.graph("cache_update").file), providers=CPU)
    rng = np.random.default_rng(0)
    feeds = {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in session.get_inputs()
             if t.name not in ("step", "parent")}
    rows = BATCH * BEAM
    feeds.update(step=np.array(2, np.int64), parent=rng.integers(0, rows, rows).astype(np.int64))
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    for tensor in m.state.graph_tensors("cache"):
        expected = feeds[tensor.name].copy()
        index = [slice(None)] * expected.ndim
        index[tensor.slot_axis] = slice(2, 3)
        expected[tuple(index)] = feeds[tensor.name + ".new"]
        expected = np.take(expected, feeds["parent"], axis=tensor.batch_axis)
        assert (outputs[tensor.name + ".next"] == expected).all(), tensor.name


@pytest.mark.slow
def test_a_device_cross_is_refused_once_the_next_batch_is_encoded(bundles):
    path, (one, two, *_) = bundles["smart"]
    bundle = Bundle.load(path, providers=CPU, device_state=True)
    first = bundle.encode_for_decoding(*one)
    bundle.encode_for_decoding(*two)
    with pytest.raises(EdgecapError, match="overwritten by a later encode"):
        bundle.decode(first)


@pytest.mark.slow
def test_what_cannot_stay_on_the_device_is_a_one_line_error(bundles, tmp_path):
    with pytest.raises(EdgecapError, match="CUDA graphs .* need the CUDA or TensorRT execution provider"):
        Bundle.load(bundles["smart"][0], providers=CPU, cuda_graph=True)
    old = tmp_path / "old"
    shutil.copytree(bundles["smart"][0], old)
    data = json.loads((old / "manifest.json").read_text())
    data["graphs"] = [g for g in data["graphs"] if g["role"] != "cache_update"]
    (old / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=r"graphs: no onnxruntime entry for the 'cache_update' graph"):
        Bundle.load(old)
    data["state"]["update"] = "host"  # a bundle exported before the cache_update graph
    (old / "manifest.json").write_text(json.dumps(data))
    assert not Bundle.load(old, providers=CPU).device_state
    with pytest.raises(EdgecapError, match="no cache_update graph .re-export it with this edgecap version"):
        Bundle.load(old, providers=CPU, device_state=True)
    del data["state"]["update"]  # what an older export wrote: the host writes the cache
    (old / "manifest.json").write_text(json.dumps(data))
    assert load_manifest(old).state.update == "host"
