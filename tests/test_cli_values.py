"""Every option of every command against the bad values its type admits (docs/cli.md).

The sweep walks the parsers `edgecap X --help` shows (tests/test_cli.py's walker): each
numeric option refuses, while the command line is parsed, a value under its bound, over it,
`nan` / `inf` and a word, in one line naming the option and what it expected, exit 2. The
cases argparse cannot see (a path that is a file, a value a config file gave, a size the
checkpoint bounds) have their own tests below.

A command copied from the docs before the data is downloaded names the missing file and
where it comes from, in one line (nothing here can be downloaded for the user).
"""

from __future__ import annotations

import argparse
import json

import pytest
from test_checkpoint import cnn_checkpoint_in
from test_cli import _command_parsers

from edgecap.argtypes import Integer, ListOf, Number


def _numeric_options():
    for prog, parser in _command_parsers():
        for action in parser._actions:
            if action.option_strings and isinstance(action.type, (Integer, Number, ListOf)):
                yield prog, action


def _bad_values(kind) -> list[str]:
    kind = kind.kind if isinstance(kind, ListOf) else kind
    bad = ["x1"]
    if isinstance(kind, Number):
        bad += ["nan", "inf", "-inf"]
    low = kind.low if kind.low is not None else getattr(kind, "above", None)
    if low is not None:
        bad.append(str(low - 1) if isinstance(kind, Integer) or kind.above is None else str(kind.above))
    if kind.high is not None:
        bad.append(str(kind.high + 1))
    return bad


SWEEP = [(prog, action.option_strings[-1], value)
         for prog, action in _numeric_options() for value in _bad_values(action.type)]


def test_every_numeric_option_says_what_it_admits():
    """No option parses a bare int or float: each has a checked type (edgecap.argtypes), so the
    sweep below covers it, and --help's reader and the error agree on one bound."""
    bare = [f"{prog} {'/'.join(a.option_strings)}" for prog, parser in _command_parsers() for a in parser._actions
            if a.type in (int, float)]
    assert bare == []
    assert len(SWEEP) > 100


@pytest.mark.parametrize("prog, option, value", SWEEP, ids=[f"{p[8:]}:{o}={v}" for p, o, v in SWEEP])
def test_a_bad_number_is_refused_while_parsing_in_one_line(run_cli, prog, option, value):
    required = {"edgecap data synth": ["--out", "w", "--images", "2"], "edgecap data sheet": ["--out", "s.png"],
                "edgecap import-m2": ["--weights", "w", "--vocab", "v", "--out", "o"],
                "edgecap index build": ["--features", "f", "--split-file", "s", "--out", "o"],
                "edgecap features extract": ["--backbone", "b", "--images", "i", "--split-file", "s", "--out", "o"],
                "edgecap eval chair": ["--captions", "c", "--acvr", "a"], "edgecap caption": ["c.pt", "i.png"],
                "edgecap export": ["c.pt"]}
    argv = prog.split()[1:] + required.get(prog, []) + [f"{option}={value}"]
    code, _, err = run_cli(*argv)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"{prog}: error: argument ") and option in err.split(":")[2] and "expected " in err and repr(value)[1:-1] in err


@pytest.mark.parametrize("script, argv", [
    ("latency.py", ["--batch-sizes", "1,0"]), ("latency.py", ["--beam", "-1"]), ("latency.py", ["--repeats", "0"]),
    ("ort_settings.py", ["--threads", "99999999999"]), ("pipeline.py", ["--timeout", "nan"]),
    ("loop.py", ["--rates", "5,-1"]), ("log_read.py", ["--size", "640"]), ("prototypes.py", ["--banks", "0"]),
    ("scst.py", ["--batch", "0"]), ("coverage.py", ["--unique", "0"]),
])
def test_benchmark_scripts_refuse_bad_values_in_one_line(python, script, argv):
    import subprocess

    from conftest import REPO

    done = subprocess.run([python, f"{REPO}/benchmarks/{script}", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"{script}: error: argument {argv[0]}: expected ")


def test_a_value_from_a_run_config_gets_the_flag_words(tmp_path, run_cli):
    config = tmp_path / "run.toml"
    config.write_text('bundle = "b"\nsource = "synth://tabletop"\nmax_fps = inf\n')
    code, _, err = run_cli("run", "--config", config)
    assert code == 1 and err == "edgecap run: error: --max-fps inf: expected a finite number > 0\n"


def test_a_run_config_that_is_not_text_is_one_line(tmp_path, run_cli):
    config = tmp_path / "run.toml"
    config.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    code, _, err = run_cli("run", "--config", config)
    assert code == 1 and err == f"edgecap run: error: --config {config}: not UTF-8 text (byte 0)\n"


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_train_out_that_is_a_users_file_is_refused_in_one_line(tmp_path, run_cli, where):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine\n")
    out = mine if where == "file" else mine / "run"
    from _train_tiny import tiny_config

    from edgecap.train.config import to_toml

    config = tmp_path / "c.toml"
    config.write_text(to_toml(tiny_config(tmp_path / "world").to_dict()))
    code, _, err = run_cli("train", "--config", config, "--out", out)
    assert code == 1 and err.count("\n") == 1, err
    expected = "exists and is not a directory" if where == "file" else f"{mine} is a file, not a directory"
    assert err.startswith(f"edgecap train: error: --out {out}") and expected in err
    assert mine.read_text() == "mine\n" and not (tmp_path / "world").exists()


def test_caption_beam_wider_than_the_vocabulary_is_one_line(tmp_path, run_cli):
    ckpt, image = cnn_checkpoint_in(tmp_path)  # a 40-word vocabulary
    code, _, err = run_cli("caption", ckpt, image, "--beam", "41")
    assert code == 1 and err == "edgecap caption: error: --beam 41: expected 1..40 (the model's vocabulary)\n"


@pytest.fixture
def official_m2(tmp_path):
    from pathlib import Path

    from test_m2_import import ITOS, official_state, save_official, save_vocab_pickle

    weights, vocab = tmp_path / "m2.pth", tmp_path / "vocab.pkl"
    save_official(weights, official_state())
    save_vocab_pickle(Path(vocab), ITOS)
    return weights, vocab


def test_import_m2_vocab_that_is_no_pickle_is_one_line(tmp_path, run_cli, official_m2):
    weights, _ = official_m2
    vocab = tmp_path / "vocab.png"
    vocab.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    code, _, err = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", tmp_path / "m2.pt")
    assert code == 1 and err.count("\n") == 1
    assert f"M2 vocabulary {vocab} is not a readable vocab pickle" in err


def test_import_m2_max_len_beyond_the_position_table_is_refused_before_building(tmp_path, run_cli, official_m2):
    from test_m2_import import TABLE_LEN

    weights, vocab = official_m2
    code, _, err = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", tmp_path / "m2.pt",
                           "--max-len", str(10**9))
    assert code == 1 and err.count("\n") == 1
    assert f"decoder.pos_emb.weight has {TABLE_LEN + 1} rows" in err and f"max_len={10**9} needs" in err
    assert not (tmp_path / "m2.pt").exists()


def test_options_that_only_qualify_another_are_refused_without_it(tmp_path, run_cli):
    """--sha256 without --weights, --images with --features, --split without --refs,
    --glove-cache without --glove: each was silently ignored."""
    split = tmp_path / "dataset_coco.json"
    split.write_text(json.dumps({"images": []}))
    code, _, err = run_cli("features", "extract", "--backbone", "mobilenet_v3_large", "--sha256", "ab" * 32,
                           "--images", tmp_path, "--split-file", split, "--out", tmp_path / "f.h5")
    assert code == 1 and "--sha256 checks the --weights file" in err
    code, _, err = run_cli("index", "build", "--features", tmp_path / "f.h5", "--images", tmp_path,
                           "--split-file", split, "--out", tmp_path / "idx")
    assert code == 1 and "--images is the image root a --checkpoint embeds" in err
    code, _, err = run_cli("eval", "chair", "--captions", tmp_path / "c.json", "--acvr", tmp_path, "--split", "val")
    assert code == 1 and "--split is the Karpathy split of --refs" in err
    code, _, err = run_cli("eval", "coverage", "--captions", tmp_path / "c.json", "--acvr", tmp_path,
                           "--glove-cache", tmp_path / "cache")
    assert code == 1 and "--glove-cache caches the vectors of a --glove FILE" in err
    code, _, err = run_cli("eval", "coverage", "--captions", tmp_path / "c.json", "--acvr", tmp_path,
                           "--images-root", tmp_path / "missing")
    assert code == 1 and f"--images-root {tmp_path / 'missing'} is not a directory" in err


def test_out_of_memory_is_one_line(monkeypatch, run_cli):
    from edgecap.models import command

    def run(args):
        raise MemoryError()

    monkeypatch.setattr(command, "run", run)
    code, _, err = run_cli("models")
    assert code == 1 and err.count("\n") == 1 and err.startswith("edgecap models: error: out of memory")


def test_an_argparse_error_is_one_line_without_the_usage_block(run_cli):
    code, _, err = run_cli("run", "--area", "boxx")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("edgecap run: error: argument --area: invalid choice: 'boxx'")


def test_integer_and_number_types_name_their_bounds():
    assert Integer(1, 8)("8") == 8 and Number(above=0)("0.5") == 0.5 and ListOf(Integer(1))("1, 2") == [1, 2]
    for kind, text in ((Integer(1, 8), "9"), (Integer(1), "1.5"), (Number(0, 1), "nan"), (Number(above=0), "0"),
                       (ListOf(Integer(1)), ",")):
        with pytest.raises(argparse.ArgumentTypeError, match="expected "):
            kind(text)


# -- the JSON a user can hand edgecap, read through edgecap.jsonio ---------------------------------

def test_a_retrieval_index_json_saved_again_with_a_bom_loads_and_a_damaged_one_is_one_line(tmp_path):
    from test_retrieval import clustered

    from edgecap.errors import EdgecapError
    from edgecap.retrieval.index import CaptionIndex

    emb, ids, captions = clustered()
    CaptionIndex.build(emb, ids, captions, k=3).save(tmp_path / "idx")
    meta = tmp_path / "idx" / "index.json"
    meta.write_bytes(b"\xef\xbb\xbf" + meta.read_bytes())  # Notepad's save
    assert CaptionIndex.load(tmp_path / "idx").image_ids == ids
    table = tmp_path / "idx" / "captions.json"
    table.write_bytes(table.read_bytes().replace(b"a", b"\xe9", 1))  # a Latin-1 edit
    with pytest.raises(EdgecapError) as info:
        CaptionIndex.load(tmp_path / "idx")
    assert str(info.value).startswith(f"retrieval index {table}: not UTF-8 text (byte ") and "\n" not in str(info.value)
    table.write_text("[]")
    with pytest.raises(EdgecapError, match="must hold JSON objects"):
        CaptionIndex.load(tmp_path / "idx")


def test_a_metrics_log_with_the_half_line_of_a_killed_run_still_reads_and_truncates(tmp_path):
    from edgecap.train.metrics_log import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    for step in (1, 2, 3):
        log.write({"kind": "train", "step": step})
    with open(log.path, "a", encoding="utf-8") as fh:
        fh.write('{"kind": "train", "st')  # killed mid-write
    assert [r["step"] for r in log.records()] == [1, 2, 3]
    log.truncate_after(2)
    assert [r["step"] for r in log.records()] == [1, 2]


def test_our_bundle_whose_manifest_was_saved_with_a_bom_is_still_ours(tmp_path):
    from edgecap.io import BUNDLE, check_replaceable

    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_bytes(b'\xef\xbb\xbf{"format": "edgecap-bundle"}')
    (bundle / "encoder.onnx").write_bytes(b"x")
    check_replaceable(bundle, BUNDLE, force=True)  # replaceable with --force, as before the edit


def test_an_m2_vocabulary_text_file_that_is_not_utf8_is_one_line(tmp_path, run_cli, official_m2):
    weights, _ = official_m2
    vocab = tmp_path / "vocab.txt"
    vocab.write_bytes(b"<pad>\n<bos>\ncaf\xe9\n")
    code, _, err = run_cli("import-m2", "--weights", weights, "--vocab", vocab, "--out", tmp_path / "m2.pt")
    assert code == 1 and err == f"edgecap import-m2: error: M2 vocabulary {vocab}: not UTF-8 text (byte 15)\n"


# -- a missing dataset or checkpoint says where to get it ------------------------------------------
KARPATHY = "dataset_coco.json in Karpathy's caption_datasets.zip (docs/training.md#getting-coco)"
M2 = "linked from the README of aimagelab/meshed-memory-transformer on GitHub (docs/pretrained.md)"


@pytest.mark.parametrize("argv, missing, source", [
    (["index", "build", "--features", "coco_vitl14.h5", "--split-file", "dataset_coco.json",
      "--out", "coco_index"], "Karpathy split file dataset_coco.json does not exist", KARPATHY),
    (["features", "extract", "--backbone", "ViT-L-14", "--images", "coco/images", "--split-file",
      "coco/dataset_coco.json", "--out", "coco_vitl14.h5"],
     "split file coco/dataset_coco.json does not exist", KARPATHY),
    (["import-m2", "--weights", "meshed_memory_transformer.pth", "--vocab", "vocab.pkl",
      "--out", "m2.pt"], "M2 checkpoint meshed_memory_transformer.pth does not exist", M2),
])
def test_a_missing_dataset_or_checkpoint_says_where_to_get_it(argv, missing, source, tmp_path,
                                                              monkeypatch, run_cli):
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(*argv)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert missing in err and source in err
    assert list(tmp_path.iterdir()) == []
