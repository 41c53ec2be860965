"""Silent results become counted, named skips: a JPEG cut short (libjpeg only prints "Premature
end of JPEG file", OpenCV's imread returns the picture as if whole) and an image name that is a
symbolic link loop are each a skipped frame named in the skip line and counted in the summary."""

import io
import json
import os

import cv2
import numpy as np
import pytest

from edgecap.image_damage import damage


def _picture(size=96) -> np.ndarray:
    from edgecap.data.synth import TabletopWorld

    return TabletopWorld(seed=2, size=size).render_frame(3)[0]


def _jpeg_by_opencv(progressive=False) -> bytes:
    flags = [cv2.IMWRITE_JPEG_PROGRESSIVE, 1] if progressive else []
    return cv2.imencode(".jpg", _picture(), flags)[1].tobytes()


def _jpeg_by_pillow(**options) -> bytes:
    Image = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    Image.fromarray(_picture()[:, :, ::-1]).save(out, "JPEG", **options)
    return out.getvalue()


@pytest.mark.parametrize("make", [_jpeg_by_opencv, lambda: _jpeg_by_opencv(progressive=True), _jpeg_by_pillow,
                                  lambda: _jpeg_by_pillow(progressive=True, optimize=True)],
                         ids=["opencv", "opencv-progressive", "pillow", "pillow-progressive"])
def test_whole_jpegs_pass_and_any_cut_is_damage(make):
    data = make()
    assert damage(data) is None
    assert damage(data + b"\0" * 64) is None  # a trailer after the end-of-image marker is allowed
    for keep in (len(data) // 3, len(data) // 2, len(data) - 2, len(data) - 1):
        assert damage(data[:keep]).startswith("damaged JPEG"), keep


def test_a_cut_png_is_damage():
    data = cv2.imencode(".png", _picture())[1].tobytes()
    assert damage(data) is None
    assert damage(data[: len(data) // 2]) == "damaged PNG: cut short (no IEND chunk)"


def test_opencv_reads_the_cut_jpeg_as_if_whole(tmp_path):
    """Why the check exists: OpenCV gives no sign that the file was cut."""
    data = _jpeg_by_opencv()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    assert cv2.imread(str(tmp_path / "half.jpg")).shape == (96, 96, 3)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("damaged"))


def test_run_names_and_counts_a_cut_jpeg_and_a_symlink_loop(bundle, tmp_path, run_cli):
    folder = tmp_path / "images"
    folder.mkdir()
    data = _jpeg_by_opencv()
    (folder / "a_whole.jpg").write_bytes(data)
    (folder / "b_half.jpg").write_bytes(data[: len(data) // 2])
    os.symlink("c_loop.jpg", folder / "c_loop.jpg")
    os.symlink("nowhere.jpg", folder / "d_gone.jpg")
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", folder, "--jsonl", out, "--quiet")
    assert code == 0, stderr
    assert [r["image_id"] for r in map(json.loads, out.read_text().splitlines())] == ["a_whole.jpg"]
    said = stdout + stderr
    assert (f"skipped: {folder / 'b_half.jpg'}: damaged JPEG: cut short (no end-of-image marker after its "
            "last scan)") in said
    assert f"skipped: {folder / 'c_loop.jpg'}: cannot read (symbolic link loop)" in said
    assert f"skipped: {folder / 'd_gone.jpg'}: cannot read (broken symbolic link)" in said
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert (summary["frames_captioned"], summary["frames_skipped"]) == (1, 3)


def test_caption_refuses_a_cut_jpeg_in_one_line(tmp_path, run_cli):
    pytest.importorskip("torch")
    from tests._export_util import CNN, save_tiny

    ckpt = save_tiny(tmp_path / "tiny.pt", "smart", **CNN)
    data = _jpeg_by_opencv()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli("caption", ckpt, tmp_path / "half.jpg", "--quiet")
    assert code == 1
    assert err.strip().splitlines() == [f"edgecap caption: error: cannot read image {tmp_path / 'half.jpg'}: "
                                        "damaged JPEG: cut short (no end-of-image marker after its last scan)"]


def test_an_empty_buffer_is_damage_not_an_opencv_assertion():
    assert damage(b"") == "empty (0 bytes)"


def _folder_with_an_empty_image(folder):
    folder.mkdir()
    (folder / "a_empty.png").write_bytes(b"")  # OpenCV's imdecode asserted on it: the whole run died
    for name in ("b.png", "c.png", "d.png"):
        cv2.imwrite(str(folder / name), _picture(32))
    return folder


def test_run_of_a_folder_with_an_empty_image_skips_and_counts_it(bundle, tmp_path, run_cli):
    folder = _folder_with_an_empty_image(tmp_path / "images")
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", folder, "--jsonl", out, "--quiet")
    assert code == 0, stderr
    assert [r["image_id"] for r in map(json.loads, out.read_text().splitlines())] == ["b.png", "c.png", "d.png"]
    assert f"skipped: {folder / 'a_empty.png'}: empty (0 bytes)" in stdout + stderr
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert (summary["frames_captioned"], summary["frames_skipped"]) == (3, 1)


def test_several_cameras_one_of_them_a_folder_with_an_empty_image(bundle, tmp_path, run_cli):
    folder = _folder_with_an_empty_image(tmp_path / "images")
    out = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", folder, "--source", "synth://tabletop?size=32",
                                   "--frames", 10, "--jsonl", out, "--quiet")
    assert code == 0, stderr
    assert f"skipped: {folder / 'a_empty.png'}: empty (0 bytes)" in stdout + stderr
    folder_camera = json.loads((tmp_path / "r.summary.json").read_text())["cameras"][0]
    assert folder_camera["frames_captioned"] == 3 and folder_camera["stopped_by"] == "end of source"
    assert sorted(r["image_id"] for r in map(json.loads, out.read_text().splitlines()) if r["camera"] == 0) \
        == ["b.png", "c.png", "d.png"]
