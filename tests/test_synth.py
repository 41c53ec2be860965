"""The synthetic tabletop world: formats, ground truth, captions, determinism, CLI.

`data synth` sizes are checked as a whole before anything is written: the issue's two
commands (accepted before, hours of rendering) are one line with the estimate, and --out is
never created.
"""

import json
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest

from edgecap.data.classes import ACVR_CLASSES, NOUN_SYNONYMS, canonical_class
from edgecap.data.synth import SYNTH_CLASSES, TabletopWorld, generate_dataset, render, sample_scene
from edgecap.data.synth.budget import MAX_BYTES, MAX_FRAMES, MAX_PIXELS, check_budget
from edgecap.data.synth.grammar import NOUNS

SMALL = dict(size=96, sequences=2, frames_per_sequence=5, video_frames=12, progress=False)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "world"
    generate_dataset(out, 60, seed=3, **SMALL)
    return out


def resolve(phrase: str) -> str | None:
    """Class named by a noun phrase, as the coverage metric would read it."""
    singulars = [phrase.replace("mice", "mouse")]
    if phrase.endswith("es"):
        singulars.append(phrase[:-2])
    if phrase.endswith("s"):
        singulars.append(phrase[:-1])
    for word in singulars:
        if word and canonical_class(word) in ACVR_CLASSES:
            return canonical_class(word)
        if word in NOUN_SYNONYMS:
            return NOUN_SYNONYMS[word]
    return None


def mentioned(text: str) -> set[str]:
    words = text.split()
    grams = words + [" ".join(words[i:i + 2]) for i in range(len(words) - 1)]
    return {c for c in map(resolve, grams) if c}


def test_importing_the_world_loads_no_torch():
    code = ("import sys, edgecap.data.synth, edgecap.data.command; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_classes_are_acvr_classes_and_enough_of_them():
    assert len(SYNTH_CLASSES) >= 12
    assert set(SYNTH_CLASSES) <= set(ACVR_CLASSES)


def test_every_caption_noun_names_its_class():
    for cls, forms in NOUNS.items():
        for singular, plural, _ in forms:
            assert resolve(singular) == cls, singular
            if plural:
                assert resolve(plural) == cls, plural


def test_same_seed_same_bytes_and_pixels_other_seed_differs(tmp_path):
    small = dict(SMALL, sequences=1, frames_per_sequence=3, video_frames=0)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_dataset(a, 8, seed=11, image_format="png", **small)
    generate_dataset(b, 8, seed=11, image_format="png", **small)
    generate_dataset(c, 8, seed=12, image_format="png", **small)
    for name in ("dataset_coco.json", "objects.json", "acvr/000000/labels.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "dataset_coco.json").read_bytes() != (c / "dataset_coco.json").read_bytes()
    for img in sorted((a / "images").rglob("*.png")):
        other = b / img.relative_to(a)
        assert np.array_equal(cv2.imread(str(img)), cv2.imread(str(other)))
    assert np.array_equal(cv2.imread(str(a / "acvr/000000/000002_mask.png"), cv2.IMREAD_UNCHANGED),
                          cv2.imread(str(b / "acvr/000000/000002_mask.png"), cv2.IMREAD_UNCHANGED))


def test_boxes_and_areas_match_the_masks():
    for seed in range(6):
        rng = np.random.default_rng(seed)
        frame = render(sample_scene(rng, 96), None, 96, rng)
        ids = set(np.unique(frame.labels)) - {0}
        assert ids == {o["mask_id"] for o in frame.objects}
        areas = [o["area"] for o in frame.objects]
        assert areas == sorted(areas, reverse=True)
        for o in frame.objects:
            ys, xs = np.nonzero(frame.labels == o["mask_id"])
            assert o["num_pixels"] == len(xs) > 0
            assert o["box"] == [xs.min(), ys.min(), xs.max(), ys.max()]
            assert o["area"] == pytest.approx(len(xs) / 96 ** 2, abs=1e-6)
        assert frame.objects[0]["class"] in ACVR_CLASSES


def test_acvr_sequences_follow_the_challenge_layout(dataset):
    seqs = sorted((dataset / "acvr").iterdir())
    assert [s.name for s in seqs] == ["000000", "000001"]
    for seq in seqs:
        labels = json.loads((seq / "labels.json").read_text())
        assert list(labels) == [f"{i:06d}" for i in range(5)]
        classes_by_instance = {}
        previous = None
        steps = []
        for frame_id, entry in labels.items():
            mask = cv2.imread(str(seq / entry["_metadata"]["mask_name"]), cv2.IMREAD_UNCHANGED)
            rgb = cv2.imread(str(seq / f"{frame_id}.png"))
            assert mask.dtype == np.uint8 and mask.shape == rgb.shape[:2] == (96, 96)
            instances = {k: v for k, v in entry.items() if not k.startswith("_")}
            assert set(np.unique(mask)) - {0} == {v["mask_id"] for v in instances.values()}
            for key, inst in instances.items():
                int(key)
                assert inst["class"] in ACVR_CLASSES
                assert classes_by_instance.setdefault(key, inst["class"]) == inst["class"]
                ys, xs = np.nonzero(mask == inst["mask_id"])
                assert inst["num_pixels"] == len(xs)
                assert inst["bounding_box"] == [xs.min(), ys.min(), xs.max(), ys.max()]
            if previous is not None:  # a slowly moving camera: neighbours look alike
                steps.append(np.abs(rgb.astype(int) - previous).mean())
            previous = rgb.astype(int)
    first = cv2.imread(str(seqs[0] / "000000.png")).astype(int)
    other = cv2.imread(str(seqs[1] / "000000.png")).astype(int)
    assert np.abs(first - other).mean() > 2 * max(steps)  # another sequence is another scene


def test_karpathy_json_has_the_real_fields(dataset):
    data = json.loads((dataset / "dataset_coco.json").read_text())
    assert data["dataset"] == "coco" and len(data["images"]) == 60
    splits = [im["split"] for im in data["images"]]
    assert set(splits) == {"train", "val", "test", "restval"}
    assert splits.count("val") == splits.count("test") == 3
    objects = json.loads((dataset / "objects.json").read_text())
    cocoids = set()
    sentid = 0
    for imgid, im in enumerate(data["images"]):
        assert isinstance(im["cocoid"], int) and im["cocoid"] not in cocoids
        cocoids.add(im["cocoid"])
        assert im["imgid"] == imgid
        img = cv2.imread(str(dataset / "images" / im["filepath"] / im["filename"]))
        assert img.shape == (96, 96, 3)
        assert len(im["sentences"]) == 5 and im["sentids"] == list(range(sentid, sentid + 5))
        for s in im["sentences"]:
            assert s["imgid"] == imgid and s["sentid"] == sentid
            assert s["tokens"] and all(re.fullmatch(r"[a-z]+", t) for t in s["tokens"])
            assert s["raw"].lower().rstrip(".").replace(",", "").split() == s["tokens"]
            sentid += 1
        gt = objects[str(im["cocoid"])]
        assert gt and all(set(o) >= {"class", "box", "area"} for o in gt)


def test_captions_mostly_name_the_largest_object(dataset):
    data = json.loads((dataset / "dataset_coco.json").read_text())
    objects = json.loads((dataset / "objects.json").read_text())
    hits = total = 0
    for im in data["images"]:
        things = [o for o in objects[str(im["cocoid"])] if o["class"] != "dining table"]
        largest = max(things, key=lambda o: o["area"])["class"]
        for s in im["sentences"]:
            total += 1
            hits += largest in mentioned(s["raw"].lower().rstrip(".").replace(",", ""))
    assert hits / total > 0.75, hits / total
    vocab = {t for im in data["images"] for s in im["sentences"] for t in s["tokens"]}
    assert 40 < len(vocab) < 250
    assert {"left", "behind", "night", "wooden", "two"} <= vocab


def test_video_and_sidecar(dataset):
    cap = cv2.VideoCapture(str(dataset / "video" / "tabletop.mp4"))
    assert cap.isOpened()
    frames = 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        assert frame.shape == (96, 96, 3)
        frames += 1
    cap.release()
    assert frames == 12
    lines = (dataset / "video" / "tabletop.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["frame"] for r in records] == list(range(12))
    assert all(r["objects"] and {"class", "box", "area"} <= set(r["objects"][0]) for r in records)


def test_live_world_is_random_access_and_changes_scene():
    world = TabletopWorld(seed=5, size=64, fps=10, scene_seconds=1.0)
    img, objs = world.render_frame(3)
    again, objs2 = TabletopWorld(seed=5, size=64, fps=10, scene_seconds=1.0).render_frame(3)
    assert img.dtype == np.uint8 and img.shape == (64, 64, 3)
    assert np.array_equal(img, again) and objs == objs2
    step = np.abs(img.astype(int) - world.render_frame(4)[0].astype(int)).mean()
    cut = np.abs(world.render_frame(9)[0].astype(int) - world.render_frame(10)[0].astype(int)).mean()
    assert cut > step
    assert len(world.reference_captions(3)) == 5


def test_cli_writes_and_refuses_bad_input(tmp_path, run_cli):
    out = tmp_path / "w"
    args = ["data", "synth", "--out", out, "--size", 64, "--sequences", 1,
            "--frames-per-sequence", 2, "--video-frames", 3, "--quiet"]
    code, stdout, _ = run_cli(*args, "--images", 5)
    assert code == 0 and "wrote 5 images" in stdout
    assert (out / "dataset_coco.json").is_file()
    code, _, err = run_cli(*args, "--images", 5)
    assert code == 1 and "already exists" in err and "--force" in err and len(err.splitlines()) == 1
    assert run_cli(*args, "--images", 4, "--force")[0] == 0
    assert len(json.loads((out / "dataset_coco.json").read_text())["images"]) == 4
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep")
    (mine / "sub" / "data.csv").write_text("1,2")
    code, _, err = run_cli(*args[:3], mine, *args[4:], "--images", 4, "--force")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"--out {mine} is not an edgecap synthetic world" in err and "notes.txt, sub/data.csv" in err
    assert (mine / "notes.txt").read_text() == "keep" and (mine / "sub" / "data.csv").read_text() == "1,2"
    code, _, err = run_cli(*args[:3], tmp_path / "x", "--images", -1)
    assert code == 2 and "--images" in err and "-1" in err
    assert not (tmp_path / "x").exists()
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    code, _, err = run_cli("data", "synth", "--out", blocker / "sub", "--images", 2, "--quiet")
    assert code == 1 and "not a directory" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(*args[:2], "--out", empty, "--images", 2, "--video-frames", 0, "--sequences", 0,
                   "--quiet")[0] == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_data_sheet_writes_only_over_its_own_png(tmp_path, run_cli):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from edgecap.png import is_ours

    photo, chart, notes = tmp_path / "photo.png", tmp_path / "chart.png", tmp_path / "notes.txt"
    cv2.imwrite(str(photo), np.full((8, 8, 3), 200, np.uint8))  # OpenCV's PNG: no text chunk
    fig = plt.figure(figsize=(1, 1))
    fig.savefig(chart)  # matplotlib's: Software = Matplotlib version ...
    plt.close(fig)
    notes.write_text("mine")
    kept = {p: p.read_bytes() for p in (photo, chart, notes)}
    for target, message in ((photo, f"--out {photo} exists and is not a PNG edgecap wrote; not overwriting it"),
                            (chart, f"--out {chart} exists and is not a PNG edgecap wrote"),
                            (notes, f"--out {notes}: expected a .png file name")):
        code, out, err = run_cli("data", "sheet", "--out", target, "--grid", "1", "--size", "32")
        assert (code, out) == (1, "") and err.count("\n") == 1 and message in err, err
    assert {p: p.read_bytes() for p in kept} == kept
    ours = tmp_path / "sheet.png"
    for _ in range(2):  # its own sheet it replaces
        code, _, err = run_cli("data", "sheet", "--out", ours, "--grid", "1", "--size", "32")
        assert code == 0, err
    assert is_ours(ours) and cv2.imread(str(ours)).shape == (86, 40, 3)


# -- sizes checked as a whole before anything is written -------------------------------------------
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
