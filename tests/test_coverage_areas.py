"""One area rule for coverage everywhere: an object's bounding-box fraction of the frame by
default ("> t", as `edgecap eval coverage` and SMArT), its mask pixels with area="pixels",
whether the objects come from ACVR labels, the live synthetic world, a detections file or the
demo model's objects.json."""

import json

import pytest

from edgecap.contract.objects import box_fraction, object_area
from edgecap.data.acvr import load_sequences
from edgecap.data.synth import TabletopWorld
from edgecap.errors import EdgecapError
from edgecap.runtime.detections import Detections
from edgecap.runtime.sources import open_source, world_objects


def test_box_fraction_counts_inclusive_pixels():
    assert box_fraction((0, 0, 9, 9), 20, 20) == 0.25
    assert box_fraction((0, 0, 0, 0), 10, 10) == 0.01
    assert box_fraction((-5, -5, 30, 30), 20, 20) == 1.0
    assert object_area((0, 0, 9, 9), 0.05, 20, 20) == 0.25
    assert object_area((0, 0, 9, 9), 0.05, 20, 20, "pixels") == 0.05
    assert object_area((0, 0, 9, 9), None, 20, 20, "pixels") == 0.25  # no mask: the box
    with pytest.raises(EdgecapError, match="area 'voxels': expected one of box, pixels"):
        object_area((0, 0, 1, 1), None, 2, 2, "voxels")


def _frame_with_a_sparse_object(size=64):
    """A frame of the world where some object's box is clearly larger than its pixels."""
    world = TabletopWorld(5, size, 10)
    for t in range(40):
        image, objects = world.render_frame(t)
        for o in objects:
            if box_fraction(o["box"], size, size) > 1.3 * o["area"]:
                return world, t, objects
    raise AssertionError("no frame with an object whose box exceeds its pixels")


def test_the_live_world_scores_box_areas_by_default():
    world, t, objects = _frame_with_a_sparse_object()
    default = open_source("synth://tabletop?seed=5&size=64&fps=10")
    pixels = open_source("synth://tabletop?seed=5&size=64&fps=10", area="pixels")
    for _ in range(t):
        default.read(), pixels.read()
    got, got_pixels = default.read().objects, pixels.read().objects
    assert [o.area for o in got] == [box_fraction(o["box"], 64, 64) for o in objects]
    assert [o.area for o in got_pixels] == [o["area"] for o in objects]
    assert any(a.area > 1.3 * b.area for a, b in zip(got, got_pixels, strict=True))


def test_a_detections_area_is_its_mask_and_the_box_decides_by_default(tmp_path):
    path = tmp_path / "det.jsonl"
    path.write_text(json.dumps({"frame_id": 0, "objects": [
        {"class": "cup", "box": [0, 0, 9, 9], "area": 0.05}, {"class": "bottle", "box": [10, 10, 19, 14]}]}) + "\n")
    assert [o.area for o in Detections(path).objects(0, 20, 20)] == [0.25, 0.125]
    assert [o.area for o in Detections(path, "pixels").objects(0, 20, 20)] == [0.05, 0.125]
    with pytest.raises(EdgecapError, match="area 'mask'"):
        Detections(path, "mask")


def test_the_worlds_sidecar_and_the_live_world_agree(tmp_path):
    """`--detections video/tabletop.jsonl` over the video and `synth://tabletop` at the same seed
    and size give each object the same coverage area, under either rule."""
    from edgecap.data.synth import generate_dataset

    out = tmp_path / "world"
    generate_dataset(out, n_images=2, seed=4, size=48, sequences=0, video_frames=5, progress=False)
    settings = json.loads((out / "synth.json").read_text())
    lines = [json.loads(x) for x in (out / "video" / "tabletop.jsonl").read_text().splitlines()]
    size, fps = settings["video_size"], settings["fps"]
    for area in ("box", "pixels"):
        sidecar = Detections(out / "video" / "tabletop.jsonl", area)
        live = open_source(f"synth://tabletop?seed=4&size={size}&fps={fps}", area=area)
        for line in lines:
            frame = live.read()
            got = sidecar.objects(line["frame"], size, size)
            assert [(o.cls, o.area) for o in got] == [(o.cls, o.area) for o in frame.objects]


def test_world_frames_written_as_acvr_read_back_with_the_same_areas(tmp_path):
    """The world's own objects and the ACVR loader over the same frames written as a sequence:
    the same area per object, box or pixels."""
    from edgecap.data.synth.writers import write_acvr_sequence

    world = TabletopWorld(3, 48, 10)
    rendered = [world.render(t) for t in range(3)]
    write_acvr_sequence(tmp_path / "000000", rendered)
    for area in ("box", "pixels"):
        frames = list(load_sequences(tmp_path, area=area))
        for frame, r in zip(frames, rendered, strict=True):
            mine = sorted((o.cls, round(o.area, 6)) for o in world_objects(r.objects, 48, 48, area))
            theirs = sorted((o.cls, round(o.area, 6)) for o in frame.foreground)
            assert mine == theirs


def test_the_demo_metrics_score_objects_json_by_box():
    from edgecap.train.demo import ground_truth

    objects = {"7": [{"class": "cup", "box": [0, 0, 9, 9], "area": 0.02, "num_pixels": 200},
                     {"class": "cup", "box": [20, 20, 24, 24], "area": 0.0025, "num_pixels": 25},
                     {"class": "bottle", "box": [30, 30, 33, 33], "area": 0.004, "num_pixels": 16}]}
    assert ground_truth(objects, "7", 100) == {"cup": 0.01, "bottle": 0.0016}
    assert ground_truth(objects, "7", 100, "pixels") == {"cup": 0.02, "bottle": 0.004}


def test_run_records_the_rule_and_rejects_an_unknown_area(tmp_path):
    import argparse

    from edgecap.runtime.command import add_arguments, settings_from_args
    from edgecap.runtime.records import Summary

    assert Summary("x").to_json()["coverage_rule"] == "box area > threshold"
    assert Summary("x", coverage_area="pixels").to_json()["coverage_rule"] == "pixels area > threshold"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from_args(parser.parse_args(["b", "--source", "0"])).area == "box"
    assert settings_from_args(parser.parse_args(["b", "--source", "0", "--area", "pixels"])).area == "pixels"
    config = tmp_path / "robot.toml"
    config.write_text('source = "0"\narea = "voxels"\n')
    with pytest.raises(EdgecapError, match="area = 'voxels'; expected box or pixels"):
        settings_from_args(parser.parse_args(["b", "--config", str(config)]))
