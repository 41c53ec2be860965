"""docs/models.md against the code: its generated lists are current, the files it names exist,
and its worked example of a new family (a preset JSON and one attention module with its state
description) is a family: added as written, it passes the family contract and exports."""

import re
import sys
from pathlib import Path

import pytest
import torch

import edgecap.models.attention as attention_package
from edgecap.models import catalog, registry

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "models.md"


def test_the_generated_lists_are_what_the_code_says():
    text = DOC.read_text(encoding="utf-8")
    found = catalog.blocks(text)
    assert set(found) == set(catalog.BLOCKS), "a catalog block is missing from docs/models.md"
    for name, make in catalog.BLOCKS.items():
        assert found[name] == make(), f"docs/models.md block {name!r} is stale: python -m edgecap.models.catalog docs/models.md"


def test_every_source_file_the_page_names_exists():
    text = DOC.read_text(encoding="utf-8")
    named = set(re.findall(r"edgecap/[\w/]+\.py", text)) - {"edgecap/models/attention/salience.py"}
    named |= {f"edgecap/models/{p}" for p in re.findall(r"`((?:attention|frontends)/\w+\.py)`", text)}
    missing = sorted(p for p in named if not (REPO / p).is_file())
    assert missing == []


def _example(path: str, language: str) -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"`{re.escape(path)}`:\n\n```{language}\n(.*?)```", text, re.S)
    assert match, f"docs/models.md has no {language} block for {path}"
    return match.group(1)


@pytest.fixture
def salience_family(tmp_path, monkeypatch):
    """The page's two files, dropped where a family's files go (an extra attention folder and
    preset folder stand in for the package's own, which a test must not write into)."""
    modules, presets = tmp_path / "attention", tmp_path / "configs"
    modules.mkdir()
    presets.mkdir()
    (modules / "salience.py").write_text(_example("edgecap/models/attention/salience.py", "python"))
    (presets / "salience.json").write_text(_example("edgecap/models/configs/salience.json", "json"))
    monkeypatch.setattr(attention_package, "__path__", [*attention_package.__path__, str(modules)])
    monkeypatch.setattr(registry, "PRESET_FOLDERS", [*registry.PRESET_FOLDERS, presets])
    for r in registry.REGISTRIES:
        monkeypatch.setattr(r, "_items", dict(r._items))
    yield "salience"
    sys.modules.pop("edgecap.models.attention.salience", None)


def test_the_worked_example_is_a_family(salience_family, tmp_path):
    from edgecap.models.command import describe
    from tests import test_family_contract as contract
    from tests._export_util import export, save_tiny

    name = salience_family
    assert name in registry.list_models() and name in registry.DECODER_SELF_ATTENTION.names()
    torch.manual_seed(0)
    assert describe(name)["memory"] == "salience"
    contract.test_the_state_description_matches_the_tensors(name)
    contract.test_the_state_description_round_trips_through_the_manifest(name)
    contract.test_incremental_decoding_equals_full_prefix(name)
    contract.test_greedy_and_beam_agree_with_prefix_decoding(name)
    contract.test_reordering_beams_moves_each_cache_tensor_along_its_batch_axis(name)

    result = export(save_tiny(tmp_path / "salience.pt", name), tmp_path / "bundle")
    parity = result.manifest.parity["onnxruntime"]
    assert parity["passed"] and parity["beam_identical"] == 1.0
    assert [t.name for t in result.manifest.state.cache] == ["self_k", "self_v", "log_salience"]
    assert "log_salience.0" in [t.name for t in result.manifest.graph("decoder_step").inputs]
