"""The parity record reads true (issue 30): fp32 records the absolute bound each graph was
checked against beside the relative rule, reduced precision records its own criteria instead
of fp32's tolerances, the default number of inputs is large enough for "identical" to mean
something, and a model that says one caption for every input is flagged."""

import torch

from edgecap.contract.manifest import load_manifest
from edgecap.export.formats import resolve_settings
from tests._export_util import CNN, export, save_tiny


def test_fp32_records_the_absolute_bound_it_checked_beside_the_relative_rule(tmp_path):
    ckpt = save_tiny(tmp_path / "cnn.pt", "smart-nomem", **CNN)
    report = export(ckpt, tmp_path / "bundle").parity["onnxruntime"]
    assert report.passed
    scale = report.feature_scale
    assert report.tolerance_checked["visual"] == report.tolerance["visual"] * max(1.0, scale)
    for role in ("encoder", "decoder_step"):
        assert report.tolerance_checked[role] == report.tolerance[role]
    for role, delta in report.max_abs_delta.items():  # every delta under the bound recorded for it
        assert delta <= report.tolerance_checked[role], role
    assert "tolerance.visual x max(1, feature_scale)" in report.criteria
    # the manifest keeps the same record
    assert load_manifest(tmp_path / "bundle").parity["onnxruntime"].tolerance_checked == report.tolerance_checked


def test_reduced_precision_records_its_own_criteria_not_fp32_tolerances(tmp_path):
    ckpt = save_tiny(tmp_path / "smart.pt", "smart")
    report = export(ckpt, tmp_path / "bundle", precision="int8").parity["onnxruntime"]
    assert report.tolerance is None and report.tolerance_checked is None
    assert report.criteria.startswith("int8: reported, not gated")
    assert report.passed


def test_the_default_parity_inputs_are_enough_to_mean_something():
    assert resolve_settings({"engine": "onnx"}).samples >= 32


def test_a_model_with_one_caption_for_every_input_is_flagged(tmp_path, run_cli):
    ckpt = save_tiny(tmp_path / "smart.pt", "smart")
    payload = torch.load(ckpt, weights_only=True)
    report = export(ckpt, tmp_path / "varied", samples=8).parity["onnxruntime"]
    assert report.distinct_captions > 1 and not report.one_caption_for_all
    # an output layer that ignores everything before it: every word equally likely, so
    # every input gets the same caption
    weight = payload["state_dict"]["fc.weight"]  # [vocab, d_model], no bias
    weight.zero_()
    deaf = tmp_path / "deaf.pt"
    torch.save(payload, deaf)
    code, stdout, err = run_cli("export", deaf, "--engine", "onnx", "--batch", 2, "--samples", 8,
                                "--out", tmp_path / "deaf", "--quiet")
    assert code == 0, err
    report = load_manifest(tmp_path / "deaf").parity["onnxruntime"]
    assert report.distinct_captions == 1 and report.one_caption_for_all
    assert "WARNING: the model gives one caption for every parity input" in stdout


class _TableStepper:
    """log-probs [R, V] per step from a table; reorders recorded."""

    def __init__(self, table):
        self.table, self.reorders = table, []

    def __call__(self, tokens, t):
        return self.table[t].copy()

    def top_k(self, tokens, t, k):
        from edgecap.contract.beam import row_top_k

        return row_top_k(self(tokens, t), k)

    def reorder(self, rows):
        self.reorders.append(list(rows))


def test_the_gates_search_replay_measures_the_bundles_own_path():
    import numpy as np

    from edgecap.contract.beam import DecodeOptions, beam_search
    from edgecap.export.verify import _Mirror

    g = np.random.default_rng(0)
    table = np.log(g.dirichlet(np.ones(6), size=(4, 2)))  # 4 steps, 2 rows (1 image x beam 2), 6 words
    bundle, torch_side = _TableStepper(table), _TableStepper(table + 3e-6)  # rounding-sized offset
    mirror = _Mirror(bundle, torch_side)
    beam_search(mirror, 1, DecodeOptions(beam_size=2, max_len=4), bos=1, eos=2, pad=0)
    assert 2e-6 < mirror.delta < 4e-6
    assert torch_side.reorders == bundle.reorders and bundle.reorders  # both followed the same path


def test_captions_that_differ_pass_the_fp32_gate_only_as_near_ties():
    from edgecap.export.verify import _mismatches

    report = {"samples": 32, "greedy_identical": 1.0, "beam_identical": 31 / 32}
    assert _mismatches(report) == ["beam captions identical for 97% of 32 inputs"]
    assert _mismatches({**report, "beam_ties": 1}) == []  # the one that differs is a near-tie
    assert _mismatches({**report, "beam_identical": 30 / 32, "beam_ties": 1}) == [
        "beam captions identical for 94% of 32 inputs, 1 of them near-ties rounding broke the other way"]


def test_a_bundle_whose_beam_reorder_is_broken_fails_the_gate(tmp_path, monkeypatch):
    """A wrong reorder leaves the bundle's numbers off PyTorch's along its own search path, so
    its different captions are never taken for near-ties."""
    import pytest

    from edgecap.errors import EdgecapError
    from edgecap.runtime.steppers import HostStepper

    monkeypatch.setattr(HostStepper, "reorder", lambda self, rows: None)
    ckpt = save_tiny(tmp_path / "smart.pt", "smart")
    with pytest.raises(EdgecapError, match=r"fp32 parity gate failed.*beam captions identical for \d+%"):
        export(ckpt, tmp_path / "bundle", samples=8)
    assert not (tmp_path / "bundle").exists()
