"""`edgecap export DIR` on a directory that is not a bundle says what the directory is (it used to
say "DIR is a bundle" of a folder of notes)."""

import json

import pytest


@pytest.mark.parametrize("engine", ["onnx", "trt"])
def test_export_of_a_folder_of_notes_says_it_is_not_a_bundle(tmp_path, run_cli, engine):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("calibrate the camera\n")
    code, stdout, err = run_cli("export", notes, "--engine", engine)
    assert (code, stdout) == (1, "")
    assert err.strip().splitlines() == [
        f"edgecap export: error: {notes} is a directory, not an edgecap bundle (no manifest.json of ours); "
        "export takes a checkpoint file (.pt), or a bundle to rebuild its TensorRT engines"]
    assert [p.name for p in notes.iterdir()] == ["todo.txt"]


def test_export_of_a_retrieval_index_names_it(tmp_path, run_cli):
    index = tmp_path / "idx"
    index.mkdir()
    (index / "index.json").write_text(json.dumps({"format": "edgecap-retrieval-index"}))
    code, _, err = run_cli("export", index, "--engine", "onnx")
    assert code == 1
    assert f"{index} is an edgecap retrieval index, not a bundle;" in err
