"""docs/models.md against the code: its generated lists are current, the files it names exist,
and its worked example of a new family (a preset JSON, one attention module with its state
description, and a training hook) is a family: added as written, it passes the family
contract, exports, and trains with its hook."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import edgecap.models.attention as attention_package
import edgecap.train.hooks as hooks_package
from edgecap.models import catalog, registry
from edgecap.train.hook import HOOKS

EXAMPLE_FILES = {"edgecap/models/attention/salience.py", "edgecap/train/hooks/salience.py"}

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
    named = set(re.findall(r"edgecap/[\w/]+\.py", text)) - EXAMPLE_FILES
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
    """The page's three files, dropped where a family's files go (extra attention, hook and
    preset folders stand in for the package's own, which a test must not write into)."""
    modules, hooks, presets = tmp_path / "attention", tmp_path / "hooks", tmp_path / "configs"
    for folder in (modules, hooks, presets):
        folder.mkdir()
    (modules / "salience.py").write_text(_example("edgecap/models/attention/salience.py", "python"))
    (hooks / "salience.py").write_text(_example("edgecap/train/hooks/salience.py", "python"))
    (presets / "salience.json").write_text(_example("edgecap/models/configs/salience.json", "json"))
    for r in (*registry.REGISTRIES, HOOKS):
        # the package's own modules registered before the snapshot restored afterwards: a module
        # already imported never registers again
        r.discover()
    monkeypatch.setattr(attention_package, "__path__", [*attention_package.__path__, str(modules)])
    monkeypatch.setattr(hooks_package, "__path__", [*hooks_package.__path__, str(hooks)])
    monkeypatch.setattr(registry, "PRESET_FOLDERS", [*registry.PRESET_FOLDERS, presets])
    for r in (*registry.REGISTRIES, HOOKS):
        monkeypatch.setattr(r, "_items", dict(r._items))
    yield "salience"
    sys.modules.pop("edgecap.train.hooks.salience", None)
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
    assert parity.passed and parity.beam_identical == 1.0
    assert [t.name for t in result.manifest.state.cache] == ["self_k", "self_v", "log_salience"]
    assert "log_salience.0" in [t.name for t in result.manifest.graph("decoder_step").inputs]


def test_the_worked_example_trains_with_its_hook(salience_family, world, tmp_path):
    """The hook's section is read and checked with the config, its lines reach metrics.jsonl,
    and its state rides in last.state.pt: a run stopped and resumed logs what one that ran
    straight through logs (the same machine and process: compared exactly)."""
    from _train_tiny import TINY_MODEL, tiny_config

    from edgecap.errors import EdgecapError
    from edgecap.train.loop import Trainer
    from edgecap.train.overrides import apply_set

    torch.set_num_threads(1)
    model = {k: v for k, v in TINY_MODEL.items() if k != "memory"} | {"preset": salience_family}
    cfg = tiny_config(world, model=model, schedule={"epochs": 1}, salience={"every": 2})
    assert cfg.salience.every == 2 and cfg.to_dict()["salience"] == {"every": 2}
    Trainer(cfg, out=tmp_path / "straight", progress=False).run()
    Trainer(cfg, out=tmp_path / "split", max_steps=3, progress=False).run()  # mid-way through a window
    assert torch.load(tmp_path / "split" / "last.state.pt", weights_only=True)["salience"]["count"] > 0
    Trainer(cfg, out=tmp_path / "split", resume=True, progress=False).run()

    def lines(run):
        return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "salience"]

    straight = lines(tmp_path / "straight")
    assert [r["step"] for r in straight][:3] == [2, 4, 6] and all(0 < r["mean_salience"] < 1 for r in straight)
    assert lines(tmp_path / "split") == straight

    with pytest.raises(EdgecapError, match=r"\[salience\] is set but preset 'smart' has no salience attention"):
        tiny_config(world, salience={"every": 3})
    with pytest.raises(EdgecapError, match=r"\[salience\]\.every = 0: expected >= 1"):
        tiny_config(world, model=model, salience={"every": 0})
    table = {"model": {"preset": salience_family}}
    apply_set(table, "salience.every=7")  # --set reaches a hook's section like any other
    assert table["salience"] == {"every": 7}
