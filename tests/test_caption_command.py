"""`edgecap caption` on folders, writing the COCO results JSON that `edgecap eval coco` reads."""

import json
import shutil

import cv2
import numpy as np
import pytest

pytest.importorskip("torch")

from tests._export_util import save_tiny  # noqa: E402

CNN = {"visual": {"kind": "cnn", "image_size": 16, "channels": [8, 24]}, "n_regions": 16}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("ckpt") / "cnn.pt", "smart-nomem", **CNN)


def _images(folder, names):
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        cv2.imwrite(str(folder / name), np.full((20, 24, 3), 40 * i, np.uint8))
    return [folder / n for n in names]


def test_folder_to_coco_results_json(ckpt, tmp_path, run_cli):
    folder = tmp_path / "val2014"
    _images(folder, ["COCO_val2014_000000000042.jpg", "000000000007.png", "kitchen.png"])
    (folder / "notes.txt").write_text("not an image")
    (folder / "sub").mkdir()
    out = tmp_path / "preds.json"
    code, stdout, err = run_cli("caption", ckpt, folder, "--json", out, "--beam", 2, "--batch", 2)
    assert code == 0, err
    records = json.loads(out.read_text())
    assert [r["image_id"] for r in records] == [7, 42, "kitchen.png"]  # name order; COCO ids as ints
    assert all(isinstance(r["caption"], str) for r in records)
    lines = [line for line in stdout.splitlines() if "\t" in line]
    assert [line.split("\t")[1] for line in lines] == [r["caption"] for r in records]
    assert f"wrote {out} (3 captions" in stdout

    # what `edgecap eval coco` reads: ids resolve to the reference split's cocoids / file names
    from edgecap.metrics.captions import read_captions
    from edgecap.metrics.coco import load_references

    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [
        {"cocoid": 42, "filename": "COCO_val2014_000000000042.jpg", "split": "val", "sentences": [{"raw": "a"}]},
        {"cocoid": 7, "filename": "000000000007.png", "split": "val", "sentences": [{"raw": "b"}]},
        {"imgid": 3, "filename": "kitchen.png", "split": "val", "sentences": [{"raw": "c"}]}]}))
    _, resolve = load_references(refs, "val")
    assert set(read_captions(out, normalize=resolve).captions) == {"42", "7", "3"}


def test_batched_captions_equal_one_by_one(ckpt, tmp_path, run_cli):
    paths = _images(tmp_path / "imgs", [f"{i}.png" for i in range(5)])
    code, batched, err = run_cli("caption", ckpt, tmp_path / "imgs", "--batch", 4, "--beam", 3)
    assert code == 0, err
    code, single, err = run_cli("caption", ckpt, *paths, "--batch", 1, "--beam", 3)
    assert code == 0, err
    assert batched == single and len(batched.splitlines()) == 5


def test_eval_coco_reads_what_caption_wrote(ckpt, tmp_path, capfd):
    from edgecap.cli import main

    if shutil.which("java") is None:
        pytest.skip("the PTB tokenizer needs java")
    _images(tmp_path / "imgs", ["000000000001.png", "000000000002.png"])
    preds = tmp_path / "preds.json"
    assert main(["caption", str(ckpt), str(tmp_path / "imgs"), "--json", str(preds), "--quiet"]) == 0
    refs = tmp_path / "dataset_coco.json"
    refs.write_text(json.dumps({"images": [
        {"cocoid": i, "filename": f"{i:012d}.png", "split": "test", "sentences": [{"raw": "w0 w1 w2."}]}
        for i in (1, 2)]}))
    capfd.readouterr()
    assert main(["eval", "coco", "--captions", str(preds), "--refs", str(refs), "--no-meteor"]) == 0
    captured = capfd.readouterr()
    assert "2 images scored" in captured.out
    # the tokenizer's JVM inherits stderr; its "PTBTokenizer tokenized N tokens" lines are noise
    assert "PTBTokenizer" not in captured.err and captured.err.strip() == ""


def test_caption_of_a_folder_with_an_empty_and_an_undecodable_image_skips_and_names_them(ckpt, tmp_path, run_cli):
    folder = tmp_path / "imgs"
    _images(folder, ["c.png", "d.png"])
    (folder / "a.png").write_bytes(b"")           # created, never written (was a cv2.error traceback)
    (folder / "b.png").write_bytes(b"not a png")
    out = tmp_path / "preds.json"
    code, _, err = run_cli("caption", ckpt, folder, "--json", out, "--quiet")
    assert code == 0, err
    assert [r["image_id"] for r in json.loads(out.read_text())] == ["c.png", "d.png"]
    lines = err.strip().splitlines()
    assert f"edgecap caption: skipped: {folder / 'a.png'}: empty (0 bytes)" in lines
    assert f"edgecap caption: skipped: {folder / 'b.png'}: cannot decode frame" in lines
    assert lines[-1] == ("edgecap caption: 2 of 4 images skipped (empty, damaged or undecodable: named above); "
                         "2 captioned")


def test_caption_of_only_unreadable_images_is_one_line_and_writes_nothing(ckpt, tmp_path, run_cli):
    (tmp_path / "a.png").write_bytes(b"")
    out = tmp_path / "preds.json"
    code, _, err = run_cli("caption", ckpt, tmp_path / "a.png", "--json", out, "--quiet")
    assert code == 1
    assert err.strip().splitlines() == [f"edgecap caption: error: cannot read image {tmp_path / 'a.png'}: "
                                        f"empty (0 bytes); nothing written to {out}"]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".preds")]


def test_bad_inputs_are_one_line_and_write_nothing(ckpt, tmp_path, run_cli):
    folder = tmp_path / "imgs"
    _images(folder, ["a.png"])

    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("caption", ckpt, tmp_path / "empty")
    assert code == 1 and "folder holds no images" in err
    # a COCO-style layout (what edgecap data synth writes): the splits are named, not searched
    _images(tmp_path / "coco" / "val2014", ["x.png"])
    _images(tmp_path / "coco" / "train2014", ["y.png"])
    code, _, err = run_cli("caption", ckpt, tmp_path / "coco")
    assert code == 1 and "its subfolders train2014, val2014 do: give one of them" in err

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}')
    code, _, err = run_cli("caption", ckpt, folder / "a.png", "--json", mine)
    assert code == 1 and "not a captions JSON; not overwriting it" in err
    assert mine.read_text() == '{"my": "notes"}'

    code, _, err = run_cli("caption", ckpt, folder / "a.png", "--beam", 0)
    assert code == 2 and "argument --beam: expected an integer in 1..100, got 0" in err


def test_an_earlier_captions_json_is_replaced(ckpt, tmp_path, run_cli):
    paths = _images(tmp_path / "imgs", ["1.png"])
    out = tmp_path / "preds.json"
    out.write_text('[{"image_id": 99, "caption": "old"}]')
    assert run_cli("caption", ckpt, *paths, "--json", out, "--quiet")[0] == 0
    assert [r["image_id"] for r in json.loads(out.read_text())] == [1]
