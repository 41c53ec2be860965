"""`data synth` sizes are checked as a whole before anything is written: the issue's two
commands (accepted before, hours of rendering) are one line with the estimate, and --out is
never created."""

import pytest

from edgecap.data.synth.budget import MAX_BYTES, MAX_FRAMES, MAX_PIXELS, check_budget


@pytest.mark.parametrize("argv, said", [
    (["--sequences", 1000000, "--frames-per-sequence", 1000000],
     ["1,000,000,000,160 frames (ceiling 2,000,000)", "held in memory per ACVR sequence of 1,000,000 frames"]),
    (["--video-frames", 1000000, "--video-size", 2048],
     ["4.19e+12 rendered pixels (ceiling 1e+11)", "about 420.4 GB written (ceiling 100.0 GB)",
      "about 24.3 days to render"]),
], ids=["acvr", "video"])
def test_a_world_over_the_ceiling_is_refused_before_anything_is_written(tmp_path, run_cli, argv, said):
    out = tmp_path / "world"
    code, stdout, err = run_cli("data", "synth", "--out", out, "--images", 10, *argv, "--quiet")
    assert (code, stdout) == (1, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgecap data: error: this world is too big: ")
    for part in said:
        assert part in lines[0]
    assert lines[0].endswith("Ask for fewer frames (--images, --sequences x --frames-per-sequence, --video-frames) "
                             "or smaller ones (--size, --video-size)")
    assert list(tmp_path.iterdir()) == []


def test_large_worlds_within_the_ceilings_are_accepted():
    coco_sized = check_budget(123_287, 128, 2, 20, 150, 128, "jpg")  # COCO's image count at the default size
    assert coco_sized["frames"] == 123_287 + 40 + 150 and coco_sized["bytes"] < MAX_BYTES
    most = check_budget(MAX_FRAMES - 190, 128, 2, 20, 150, 128, "jpg")
    assert most["frames"] == MAX_FRAMES and most["pixels"] < MAX_PIXELS
    with pytest.raises(Exception, match="2,000,001 frames"):
        check_budget(MAX_FRAMES - 189, 128, 2, 20, 150, 128, "jpg")
