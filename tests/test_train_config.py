"""Training config (TOML) errors, the shipped configs, and the learning-rate schedules."""

from pathlib import Path

import pytest
from conftest import REPO

from edgecap.errors import EdgecapError
from edgecap.train.config import parse_config
from edgecap.train.overrides import load_config
from edgecap.train.schedules import Noam, WarmupConstantDecay, make_optimizer

BASE = {"model": {"preset": "smart"}, "data": {"karpathy": "d.json", "features": "f.h5"}}


def cfg(**sections):
    data = {k: dict(v) for k, v in BASE.items()}
    for name, table in sections.items():
        data[name] = {**data.get(name, {}), **table}
    return parse_config(data, source="x.toml")


@pytest.mark.parametrize("sections, message", [
    ({"optim": {"lrr": 1.0}}, r"x.toml: \[optim\]: unknown key 'lrr' \(did you mean 'lr'\?\)"),
    ({"data": {"bach_size": 4}}, r"\[data\]: unknown key 'bach_size' \(did you mean 'batch_size'\?\)"),
    ({"data": {"synth": {"imgs": 4}}}, r"\[data\]\.synth: unknown key 'imgs'"),
    ({"model": {"d_modle": 64}}, r"unknown field 'd_modle' \(did you mean 'd_model'\?\)"),
    ({"model": {"preset": "smartt"}}, r"unknown model 'smartt' \(did you mean 'smart'"),
    ({"model": {"vocab_size": 10}}, r"vocab_size is set from the training vocabulary"),
    ({"optim": {"lr": "fast"}}, r"\[optim\]\.lr = 'fast': expected a number"),
    ({"schedule": {"epochs": 2.5}}, r"\[schedule\]\.epochs = 2.5: expected an integer"),
    ({"schedule": {"kind": "cosine"}}, r"\[schedule\]\.kind = 'cosine'.*expected one of noam"),
    ({"scst": {"baseline": "greedyy", "epochs": 1}}, r"\[scst\]\.baseline = 'greedyy' \(did you mean 'greedy'\?\)"),
    ({"scst": {"beam_size": 1, "epochs": 1}}, r"needs beam_size >= 2"),
    ({"prototypes": {"stride": 10}}, r"\[prototypes\] is set but preset 'smart' has no prototype memory"),
    ({"schedule": {"epochs": 0}}, r"nothing to train"),
    ({"run": {"devce": "cpu"}}, r"\[run\]: unknown key 'devce' \(did you mean 'device'\?\)"),
    # TOML has nan and inf; a nan learning rate trains nothing
    ({"optim": {"lr": float("nan")}}, r"\[optim\]\.lr = nan: expected a finite number"),
    ({"schedule": {"decay_rate": float("inf")}}, r"\[schedule\]\.decay_rate = inf: expected a finite number"),
    # [model] fields are typed like every other section, not passed on to fail inside torch
    ({"model": {"memory": {"slots": "16"}}}, r"'smart'\.memory\.slots = '16': expected an integer"),
    ({"model": {"d_model": 160.0}}, r"'smart'\.d_model = 160.0: expected an integer"),
    ({"model": {"dropout": "0.1"}}, r"'smart'\.dropout = '0.1': expected a number"),
    ({"model": {"visual": {"kind": "cnn", "channels": "24,48"}}},
     r"'smart'\.visual\.channels = '24,48': expected a list of integers"),
    ({"model": {"visual": {"kind": "cnn", "mean": [0.5, 0.5]}}},
     r"'smart'\.visual\.mean = \[0.5, 0.5\]: expected a list of 3 numbers"),
    ({"model": {"n_heads": 0}}, r"config 'smart': n_heads=0, expected >= 1"),
    ({"model": {"dropout": 1.5}}, r"config 'smart': dropout=1.5, expected a probability in \[0, 1\)"),
])
def test_bad_keys_and_values_are_one_line_errors(sections, message):
    with pytest.raises(EdgecapError, match=message) as exc:
        cfg(**sections)
    assert "\n" not in str(exc.value)


def test_unknown_section_and_missing_parts():
    with pytest.raises(EdgecapError, match=r"unknown section \[optimizer\] \(did you mean 'optim'\?\)"):
        parse_config({**BASE, "optimizer": {}}, source="x.toml")
    with pytest.raises(EdgecapError, match=r"\[model\] needs preset"):
        parse_config({"model": {}, "data": BASE["data"]})
    with pytest.raises(EdgecapError, match=r"exactly one of images"):
        parse_config({"model": {"preset": "smart"}, "data": {"karpathy": "d.json"}})


def test_prototype_keys_are_checked_against_prototype_memory():
    pma = {"model": {"preset": "pma-edge"}}
    with pytest.raises(EdgecapError, match=r"\[prototypes\]: unknown key 'strde' \(did you mean 'stride'\?\)"):
        cfg(**pma, prototypes={"strde": 10})
    ok = cfg(**pma, prototypes={"stride": 10, "bank_iterations": 10})
    assert (ok.prototypes.stride, ok.prototypes.bank_iterations, ok.prototypes.topk) == (10, 10, 32)
    assert ok.prototypes.seed is None and ok.prototypes.use_gpu is None  # unset: the run's seed, auto


@pytest.mark.parametrize("table, message", [
    # refused when the config is read, not after the data step
    ({"stride": 0}, r"\[prototypes\]\.stride=0: expected a positive integer"),
    ({"seed": "1"}, r"\[prototypes\]\.seed = '1': expected an integer"),
    ({"use_gpu": 1}, r"\[prototypes\]\.use_gpu = 1: expected true or false"),
])
def test_bad_prototype_settings_are_one_line_errors(table, message):
    with pytest.raises(EdgecapError, match=message):
        cfg(model={"preset": "pma-edge"}, prototypes=table)


def test_model_overrides_reach_the_model_config():
    c = cfg(model={"d_model": 64, "n_heads": 4, "memory": {"slots": 8}})
    mc = c.model_config(vocab_size=321)
    assert (mc.d_model, mc.memory.slots, mc.vocab_size, mc.enc_layers) == (64, 8, 321, 2)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(EdgecapError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\npreset = 1")
    with pytest.raises(EdgecapError, match="not valid TOML"):
        load_config(bad)


@pytest.mark.parametrize("text, message", [
    ('model = "nonexistent-family"\n[data]\nkarpathy = "d.json"\nfeatures = "f.h5"\n',
     "model = 'nonexistent-family' is not a section: expected a [model] table with preset = "),
    ('prototypes = 3\n[model]\npreset = "pma-edge"\n', "prototypes = 3 is not a section"),
    ('[model]\npreset = "nonexistent-family"\n[data]\nkarpathy = "d.json"\nfeatures = "f.h5"\n',
     "[model]: unknown model 'nonexistent-family'; valid: acf, m2"),
    ('[model]\npreset = "smart"\nd_model = "160"\n[data]\nkarpathy = "d.json"\nfeatures = "f.h5"\n',
     "[model]: config 'smart'.d_model = '160': expected an integer"),
    ('[model]\npreset = "smart"\nn_heads = 0\n[data]\nkarpathy = "d.json"\nfeatures = "f.h5"\n',
     "[model]: config 'smart': n_heads=0, expected >= 1"),
])
def test_train_cli_names_the_bad_section_in_one_line(tmp_path, run_cli, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    code, _, err = run_cli("train", "--config", config, "--out", tmp_path / "run")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"{config}: " in err and message in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("assignment, message", [
    ("model.visual.kind=cnnn", "unknown visual front end 'cnnn' (did you mean 'cnn'?)"),
    ("model.encoder_attention=memroy", "unknown encoder attention 'memroy' (did you mean 'memory'?)"),
])
def test_a_misspelt_part_fails_before_the_run_prepares_data(tmp_path, run_cli, assignment, message):
    """Registered names are checked with the config, not when the model is built after the data
    step (minutes of synthetic-world generation, or a missing dataset reported instead)."""
    config = tmp_path / "c.toml"
    config.write_text('[model]\npreset = "smart"\n[data]\nkarpathy = "missing.json"\nimages = "imgs"\n')
    code, _, err = run_cli("train", "--config", config, "--set", assignment, "--out", tmp_path / "run")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert message in err and f"(after --set {assignment})" in err
    assert not (tmp_path / "run").exists()


def test_a_config_saved_with_a_byte_order_mark_reads_like_one_without(tmp_path):
    """Windows Notepad (before 2019) saved UTF-8 with a BOM, which tomllib refuses."""
    text = (Path(REPO) / "configs" / "demo-tabletop.toml").read_text(encoding="utf-8")
    bom = tmp_path / "notepad.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert load_config(bom).to_dict() == load_config(Path(REPO) / "configs" / "demo-tabletop.toml").to_dict()


def test_a_binary_config_is_one_line(tmp_path, run_cli):
    config = tmp_path / "weights.toml"
    config.write_bytes(b"\x80\x81PK\x03\x04" * 8)
    code, _, err = run_cli("train", "--config", config)
    assert code == 1 and err.strip() == f"edgecap train: error: config {config}: not UTF-8 text (byte 0)"


CONFIGS = sorted((Path(REPO) / "configs").glob("*.toml"))


def test_every_family_has_a_coco_config():
    names = {p.stem for p in CONFIGS}
    for family in ("smart", "smart-nomem", "pma", "pma-edge", "m2", "transformer", "updown"):
        assert f"coco-{family}" in names, f"configs/coco-{family}.toml missing"
    assert "demo-tabletop" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_configs_parse_and_build(path):
    from edgecap.models import build_from_config

    c = load_config(path)
    mc = c.model_config(vocab_size=50)
    model = build_from_config(mc)  # visual / grid sizes are consistent
    assert model.num_parameters() > 0


def test_noam_schedule_matches_the_transformer_formula():
    s = Noam(d_model=512, warmup=10000)
    assert s(10000) == pytest.approx(512 ** -0.5 * 10000 ** -0.5)  # the peak
    assert s(5000) == pytest.approx(s(10000) * 0.5)  # linear ramp
    assert s(40000) == pytest.approx(s(10000) * 0.5)  # inverse square-root decay
    assert max(range(1, 30000, 97), key=s) in range(9900, 10100)


def test_warmup_constant_decay_shape():
    s = WarmupConstantDecay(peak=1e-3, warmup=100, decay_start=1000, decay_every=500, decay_rate=0.5, min_lr=1e-4)
    assert s(50) == pytest.approx(5e-4)
    assert s(100) == s(999) == pytest.approx(1e-3)
    assert s(1000) == pytest.approx(5e-4)
    assert s(1500) == pytest.approx(2.5e-4)
    assert s(10**6) == pytest.approx(1e-4)


def test_adam_with_weight_decay_is_refused():
    import torch

    with pytest.raises(EdgecapError, match="adamw"):
        make_optimizer("adam", [torch.nn.Parameter(torch.zeros(1))], 1e-3, (0.9, 0.98), weight_decay=0.01)


@pytest.mark.parametrize("name", ["coco-m2", "coco-smart", "coco-smart-nomem", "coco-transformer"])
def test_m2_family_configs_build_the_optimizers_of_the_m2_code(name):
    """M2 train.py: XE `Adam(params, lr=1, betas=(0.9, 0.98))` (torch's eps 1e-8) under
    LambdaLR(d_model^-0.5 * min(s^-0.5, s * 10000^-1.5)); SCST `Adam(params, lr=5e-6)`;
    `NLLLoss(ignore_index=pad)`, no label smoothing."""
    import torch

    from edgecap.train.schedules import Constant, xe_schedule

    cfg = load_config(Path(REPO) / "configs" / f"{name}.toml")
    params = [torch.nn.Parameter(torch.zeros(1))]
    xe = make_optimizer(cfg.optim.optimizer, params, 0.0, cfg.optim.betas, cfg.optim.eps, cfg.optim.weight_decay)
    official = torch.optim.Adam(params, lr=1, betas=(0.9, 0.98))
    for key in ("betas", "eps", "weight_decay", "amsgrad"):
        assert xe.defaults[key] == official.defaults[key], key
    assert type(xe) is torch.optim.Adam
    d = 512
    schedule = xe_schedule(cfg, d)
    for s in (1, 10, 5000, 10000, 123456):
        assert schedule(s) == pytest.approx(d ** -0.5 * min(s ** -0.5, s * 10000 ** -1.5))
    scst = make_optimizer(cfg.scst.optimizer, params, cfg.scst.lr, cfg.scst.betas)
    official = torch.optim.Adam(params, lr=5e-6)
    for key in ("lr", "betas", "eps", "weight_decay"):
        assert scst.defaults[key] == official.defaults[key], key
    assert Constant(cfg.scst.lr)(1) == 5e-6 and cfg.scst.beam_size == 5 and cfg.scst.baseline == "mean"


@pytest.mark.parametrize("name", ["coco-m2", "coco-smart", "coco-smart-nomem", "coco-transformer", "coco-pma",
                                  "coco-pma-edge", "coco-updown"])
def test_coco_configs_select_and_switch_as_the_papers_do(name):
    """M2 train.py: XE until validation CIDEr-D (beam 5) has not improved for 5 epochs, SCST
    from the best XE weights until 5 more without one."""
    cfg = load_config(Path(REPO) / "configs" / f"{name}.toml")
    assert cfg.schedule.patience == 5 and cfg.scst.patience == 5 and cfg.run.val_beam == 5
    assert cfg.scst.epochs > 0
