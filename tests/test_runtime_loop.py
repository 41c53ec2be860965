"""The captioning loop on a bundle-shaped numpy model: padding, records, JSONL, summary,
coverage, the beam governor, rate limiting and the `edgecap run` plumbing.

The runtime preprocesses straight into its batch buffer (contract.preprocess.preprocess, out=):
the values must be exactly those of the plain formula, whatever the geometry or channel order.

The summary's latency percentiles come from a bounded histogram: within 1% of numpy's exact
percentiles over long runs of skewed latencies, in the same memory after 10 frames or 10^6.
"""

import json
import re
import threading

import cv2
import numpy as np
import pytest
from runtime_helpers import FakeBundle, ScriptedSource, hidden_leftovers, solid

from edgecap.contract.preprocess import preprocess, preprocess_as
from edgecap.errors import EdgecapError, MissingExtraError
from edgecap.runtime.camera import FrameGrabber
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, execute
from edgecap.runtime.histogram import LogHistogram
from edgecap.runtime.loop import BeamGovernor, LoopOptions, run_loop
from edgecap.runtime.records import Summary
from edgecap.runtime.scoring import COVERAGE_OFF, CoverageAnnotator

RED, GREEN, BLUE = (0, 0, 255), (0, 255, 0), (255, 0, 0)  # BGR


def test_partial_batch_is_padded_and_the_padding_discarded():
    bundle = FakeBundle(batch_size=4, beam_size=2)
    captioner = Captioner(bundle)
    frames = [solid(RED), solid(BLUE), solid(GREEN), solid(RED, size=40), solid(BLUE, size=7)]
    caps = captioner.caption(frames)
    assert [c.text for c in caps] == ["a red cup", "a blue cup", "a green cup", "a red cup", "a blue cup"]
    assert [c.tokens for c in caps][0] == [4, 5, 8]
    # Two static batches of 4: the second holds one real frame and three zero rows.
    assert len(bundle.seen_batches) == 2
    second = bundle.seen_batches[1]
    assert np.array_equal(second[0], preprocess(frames[4], 32, (0.5,) * 3, (0.25,) * 3))
    assert not second[1:].any()
    assert set(caps[0].latency_ms) == {"preprocess", "visual", "encoder", "decode"}
    # The image buffer is the same array across calls: no per-frame allocation.
    assert captioner.preprocess_into([frames[0]]) is captioner._images


def test_beam_is_checked_against_the_bundle():
    captioner = Captioner(FakeBundle(beam_size=2))
    assert captioner.caption([solid(RED)], beam=1)[0].beam == 1
    with pytest.raises(EdgecapError, match="beams 1..2"):
        captioner.caption([solid(RED)], beam=3)
    with pytest.raises(EdgecapError, match="beams 1..2"):
        Captioner(FakeBundle(beam_size=2), beam=4)


def _loop(script, options=None, coverage=None, pace="every", **kw):
    options = options or LoopOptions()
    source = ScriptedSource(script, fps=kw.pop("fps", None))
    source.open()
    records = []
    summary = Summary("scripted")
    grabber = FrameGrabber(source, pace=pace)
    with grabber:
        run_loop(Captioner(FakeBundle(**kw)), grabber, summary, [records.append], options,
                 threading.Event(), coverage=coverage)
    summary.grabber = grabber.stats
    return records, summary


def test_loop_records_every_frame_with_latency_and_summary():
    script = [solid(RED), "bad", solid(GREEN), solid(BLUE)]
    records, summary = _loop(script, LoopOptions(batch=2), batch_size=2)
    assert [r.caption.text for r in records] == ["a red cup", "a green cup", "a blue cup"]
    rec = records[0].to_json()
    assert rec["frame_id"] == 0 and rec["caption"] == "a red cup" and rec["tokens"] == [4, 5, 8]
    assert rec["capture_to_caption_ms"] >= sum(rec["latency_ms"].values()) * 0.999
    assert "coverage" not in rec and "objects" not in rec
    s = summary.to_json()
    assert s["frames_captioned"] == 3 and s["frames_skipped"] == 1 and s["frames_dropped"] == 0
    assert s["stopped_by"] == "end of source"
    assert s["capture_to_caption_ms"]["p50"] > 0
    assert "3 frames captioned, 0 dropped, 1 skipped" in summary.human()


def test_frames_limit_stops_the_loop():
    records, summary = _loop([solid(RED)] * 10, LoopOptions(frames=4, batch=3), batch_size=4)
    assert len(records) == 4 and summary.stopped_by == "--frames 4"


def test_max_fps_spaces_the_takes():
    # 40 frames at 200 fps (0.2 s); captioning at most 20/s takes about every 10th frame.
    records, summary = _loop([solid(RED)] * 40, LoopOptions(max_fps=20.0), pace="native", fps=200.0)
    takes = [r.frame.t_taken for r in records]
    assert np.all(np.diff(takes) >= 1 / 20.0)
    assert summary.grabber.dropped > 0
    assert summary.grabber.dropped + len(records) == 40


def test_beam_governor_lowers_then_restores_the_beam():
    g = BeamGovernor(beam=3, budget_ms=100.0, window=2)
    beams = [g.update(ms) for ms in [150, 150, 150, 150, 150, 150, 20, 20, 20, 20, 20, 20]]
    assert beams == [3, 2, 2, 1, 1, 1, 1, 2, 2, 3, 3, 3]
    assert BeamGovernor(3, None).update(10_000) == 3


class _FakeScorer:
    """A CoverageScorer stand-in: an object is covered when the caption names its class."""

    def score(self, captions, gts):
        from edgecap.metrics.coverage import CoverageResult, Match

        out = []
        for caption, gt in zip(captions, gts, strict=True):
            cov, matches = {}, {}
            for t in (0.01, 0.03, 0.05, 0.10):
                cls = [c for c, a in gt.items() if a > t]  # the metric's "> t"
                hits = [c for c in cls if c in caption.split()]
                cov[t] = len(hits) / len(cls) if cls else None
                matches[t] = [Match(c, c, 1.0, True) for c in hits]
            out.append(CoverageResult(caption, caption.split(), [], gt, cov, matches))
        return out


def test_coverage_is_scored_when_objects_are_known():
    from edgecap.runtime.sources import KnownObject

    objects = [KnownObject("cup", (0, 0, 5, 5), 0.2), KnownObject("bottle", (6, 6, 9, 9), 0.02)]
    records, summary = _loop([(solid(RED), objects)],
                             coverage=CoverageAnnotator(scorer=_FakeScorer()))
    rec = records[0].to_json()
    assert rec["coverage"] == {">1%": 0.5, ">3%": 1.0, ">5%": 1.0, ">10%": 1.0}
    assert rec["mentioned"] == [{"noun": "cup", "class": "cup", "profit": 1.0, "exact": True}]
    assert rec["objects"][0] == {"class": "cup", "box": [0, 0, 5, 5], "area": 0.2}
    assert summary.to_json()["coverage_mean"][">1%"] == 0.5
    assert "mean coverage (box area > threshold): >1% 50.0 (n=1)" in summary.human()


def test_missing_nlp_extra_turns_coverage_off_once(monkeypatch):
    messages = []
    annotator = CoverageAnnotator(log=messages.append)

    def missing():
        raise MissingExtraError("spacy", "nlp", "coverage")

    monkeypatch.setattr(annotator, "_load", missing)
    from edgecap.runtime.sources import KnownObject

    objs = [KnownObject("cup", (0, 0, 1, 1), 0.5)]
    assert annotator.score("a cup", objs) is None
    assert annotator.score("a cup", objs) is None
    assert messages == [COVERAGE_OFF]


def _folder(tmp_path, colours):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, c in enumerate(colours):
        cv2.imwrite(str(folder / f"{i:03d}.png"), solid(c, size=20))
    return folder


def test_execute_on_a_folder_writes_jsonl_summary_and_video(tmp_path):
    import io

    folder = _folder(tmp_path, [RED, GREEN, BLUE, RED])
    (folder / "003b.png").write_bytes(b"garbage")
    out = io.StringIO()
    settings = RunSettings(source=str(folder), jsonl=str(tmp_path / "run.jsonl"),
                           save_video=str(tmp_path / "run.mp4"), beam=2)
    summary, error = execute(Captioner(FakeBundle()), settings, out=out)
    assert error is None
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert [r["caption"] for r in recs] == ["a red cup", "a green cup", "a blue cup", "a red cup"]
    assert [r["image_id"] for r in recs] == ["000.png", "001.png", "002.png", "003.png"]
    assert all(r["beam"] == 2 for r in recs)
    saved = json.loads((tmp_path / "run.summary.json").read_text())
    assert saved["frames_captioned"] == 4 and saved["frames_skipped"] == 1
    text = out.getvalue()
    assert "a green cup" in text and "summary: 4 frames captioned" in text
    cap = cv2.VideoCapture(str(tmp_path / "run.mp4"))
    n = 0
    while cap.read()[0]:
        n += 1
    assert n == 4
    assert hidden_leftovers(tmp_path) == [], "the temporary video was left behind"


def test_append_keeps_earlier_runs_and_marks_where_each_starts(tmp_path):
    import io

    from edgecap.metrics.captions import read_captions

    folder = _folder(tmp_path, [RED, GREEN])
    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text('{"image_id": "old.png", "caption": "kept from before"}\n{"image_id": "cut", "capt')
    for _ in range(2):  # a service restarted by systemd after the first run
        settings = RunSettings(source=str(folder), jsonl=str(jsonl), append=True, bundle="b")
        summary, error = execute(Captioner(FakeBundle()), settings, out=io.StringIO())
        assert error is None and summary.captioned == 2
    lines = jsonl.read_text().splitlines()
    assert lines[0] == '{"image_id": "old.png", "caption": "kept from before"}'
    assert lines[1] == '{"image_id": "cut", "capt'  # the killed run's last half line stays alone
    recs = [json.loads(line) for line in lines[2:]]
    kinds = [r.get("kind", "caption") for r in recs]
    assert kinds == ["run_start", "caption", "caption", "run_end"] * 2
    start, end = recs[0], recs[3]
    assert start["source"] == str(folder) and start["bundle"] == "b" and start["wall_time"] > 0
    assert end["frames_captioned"] == 2 and end["stopped_by"] == "end of source"
    # readers skip the markers (and the half line), not count them as broken captions
    cap = read_captions(jsonl)
    assert cap.counts["run_markers"] == 4 and cap.counts["malformed_records"] == 1
    assert cap.captions["old.png"] == "kept from before" and cap.captions["000.png"] == "a red cup"


def test_without_append_the_jsonl_is_replaced(tmp_path):
    import io

    folder = _folder(tmp_path, [RED])
    jsonl = tmp_path / "captions.jsonl"
    jsonl.write_text('{"image_id": "old.png", "caption": "from before"}\n')
    execute(Captioner(FakeBundle()), RunSettings(source=str(folder), jsonl=str(jsonl)), out=io.StringIO())
    assert [json.loads(line)["caption"] for line in jsonl.read_text().splitlines()] == ["a red cup"]


def test_execute_with_detections_scores_them(tmp_path, monkeypatch):
    import io

    import edgecap.runtime.scoring as scoring

    folder = _folder(tmp_path, [RED, GREEN])
    det = tmp_path / "det.jsonl"
    det.write_text(json.dumps({"frame_id": 1, "objects": [{"class": "cup", "box": [0, 0, 9, 9]}]}) + "\n")
    settings = RunSettings(source=str(folder), jsonl=str(tmp_path / "r.jsonl"), detections=str(det))
    monkeypatch.setattr(scoring.CoverageAnnotator, "_load", lambda self: _FakeScorer())
    execute(Captioner(FakeBundle()), settings, out=io.StringIO())
    recs = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert "coverage" not in recs[0]  # the detector said nothing about frame 0
    assert recs[1]["objects"] == [{"class": "cup", "box": [0, 0, 9, 9], "area": 0.25, "box_area": 0.25}]
    assert recs[1]["coverage"][">1%"] == 1.0


@pytest.mark.parametrize("line, message", [
    ('{"objects": []}', "'frame_id' must be an integer"),
    ('{"frame_id": 0, "objects": [{"class": "cup", "box": [5, 5, 1, 1]}]}', "right < left"),
    ('{"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, 1, 1], "area": 3}]}', "fraction"),
    ("not json", "invalid JSON"),
    # NaN / Infinity as Python's json.dumps writes them: a box must not become "covers the frame"
    ('{"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, NaN, 9]}]}', "'box': expected a finite number, got nan"),
    ('{"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, 9, 9], "area": Infinity}]}',
     "'area': expected a finite number, got inf"),
])
def test_bad_detections_file_names_the_line(tmp_path, line, message):
    from edgecap.runtime.detections import Detections

    path = tmp_path / "d.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(EdgecapError, match=message) as info:
        Detections(path)
    assert f"{path}:1" in str(info.value)


def test_detections_written_with_a_byte_order_mark(tmp_path):
    """PowerShell 5's `Out-File -Encoding utf8` starts the file with a BOM."""
    from edgecap.runtime.detections import Detections

    path = tmp_path / "d.jsonl"
    line = json.dumps({"frame_id": 3, "objects": [{"class": "tvmonitor", "box": [0, 0, 9, 9]}]})
    path.write_bytes(b"\xef\xbb\xbf" + line.encode() + b"\r\n")
    objects = Detections(path).objects(3, 20, 20)
    assert [(o.cls, o.area) for o in objects] == [("television", 0.25)]


def test_execute_rejects_a_batch_larger_than_the_bundle(tmp_path):
    folder = _folder(tmp_path, [RED])
    with pytest.raises(EdgecapError, match="static batch 2"):
        execute(Captioner(FakeBundle(batch_size=2)), RunSettings(source=str(folder), batch=3))


def test_show_without_a_gui_build_is_a_clear_error(tmp_path):
    if "GUI:" in cv2.getBuildInformation() and "NONE" not in cv2.getBuildInformation().split("GUI:")[1][:40]:
        pytest.skip("this OpenCV has a GUI backend")
    folder = _folder(tmp_path, [RED])
    with pytest.raises(EdgecapError, match="--show needs an OpenCV build with GUI support"):
        execute(Captioner(FakeBundle()), RunSettings(source=str(folder), show=True))


def test_detections_replace_the_sources_own_objects(tmp_path):
    from edgecap.runtime.sources import KnownObject

    gt = [KnownObject("bowl", (0, 0, 5, 5), 0.3)]
    source = ScriptedSource([(solid(RED), gt), (solid(RED), gt)])
    source.open()
    detected = {0: [KnownObject("cup", (1, 1, 2, 2), 0.1)]}
    records = []
    with FrameGrabber(source, pace="every") as grabber:
        run_loop(Captioner(FakeBundle()), grabber, Summary("x"), [records.append], LoopOptions(),
                 threading.Event(), annotate_objects=lambda frames: [detected.get(f.frame_id) for f in frames])
    assert [o.cls for o in records[0].frame.objects] == ["cup"]
    assert records[1].frame.objects is None


def test_run_outputs_never_replace_what_edgecap_did_not_write(tmp_path):
    import io

    folder = _folder(tmp_path, [RED, GREEN])

    def run(**outputs):
        return execute(Captioner(FakeBundle()), RunSettings(source=str(folder), quiet=True, **outputs),
                       out=io.StringIO())

    detections = tmp_path / "video.jsonl"  # a detector's output, the usual --detections input
    detections.write_text('{"frame_id": 0, "objects": [{"class": "cup", "box": [0, 0, 4, 4]}]}\n')
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my notes\n")
    theirs = tmp_path / "drive.mp4"  # a camera's recording: not mp4v
    writer = cv2.VideoWriter(str(theirs), cv2.VideoWriter_fourcc(*"MJPG"), 5, (16, 16))
    writer.write(np.zeros((16, 16, 3), np.uint8))
    writer.release()
    their_summary = tmp_path / "fresh.summary.json"  # where --jsonl fresh.jsonl puts its summary
    their_summary.write_text('{"mine": 1}')
    kept = {p: p.read_bytes() for p in (detections, notes, theirs, their_summary)}
    for outputs, message in [
        ({"jsonl": str(detections), "detections": str(detections)},
         f"--jsonl {detections} is also --detections; write each output to its own file"),
        ({"jsonl": str(notes)}, f"--jsonl {notes} exists and is not a caption log written by edgecap run"),
        ({"jsonl": str(notes), "append": True}, "not appending to it"),
        ({"jsonl": str(tmp_path / "fresh.jsonl")},
         f"its summary file {their_summary} exists and is not a run summary written by edgecap run"),
        ({"save_video": str(theirs)}, f"--save-video {theirs} exists and is not a video edgecap could have written"),
    ]:
        with pytest.raises(EdgecapError, match=re.escape(message)):
            run(**outputs)
    assert {p: p.read_bytes() for p in kept} == kept
    # what edgecap run wrote, it replaces
    ours = {"jsonl": str(tmp_path / "run.jsonl"), "save_video": str(tmp_path / "run.mp4")}
    for frames in (2, 1):
        summary, error = run(frames=frames, **ours)
        assert error is None and len((tmp_path / "run.jsonl").read_text().splitlines()) == frames


def test_save_video_over_its_own_source_is_refused(tmp_path):
    import io

    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 5, (16, 16))
    for _ in range(3):
        writer.write(np.zeros((16, 16, 3), np.uint8))
    writer.release()
    before = video.read_bytes()
    with pytest.raises(EdgecapError, match=re.escape(f"--save-video {video} is also --source")):
        execute(Captioner(FakeBundle()), RunSettings(source=str(video), save_video=str(video)),
                out=io.StringIO())
    assert video.read_bytes() == before


# -- preprocessing straight into the batch buffer --------------------------------------------------
def _formula(image_bgr, size, mean, std, channel_order):
    """The textbook steps, one array each: resize, channels, scale, normalise, channels first."""
    image = cv2.resize(image_bgr, (size, size), interpolation=cv2.INTER_LINEAR)
    if channel_order == "RGB":
        image = image[:, :, ::-1]
    x = image.astype(np.float32) / 255.0
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


@pytest.mark.parametrize("shape, order", [((480, 640, 3), "RGB"), ((300, 200, 3), "BGR"), ((64, 64, 3), "RGB")])
def test_writing_into_a_batch_row_gives_the_formulas_values_exactly(shape, order):
    image = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    settings = {"size": 64, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "channel_order": order}
    batch = np.full((3, 3, 64, 64), 7.0, np.float32)
    got = preprocess_as(image, settings, out=batch[1])
    want = _formula(image, 64, settings["mean"], settings["std"], order)
    assert got is not None and np.shares_memory(got, batch) and np.array_equal(batch[1], want)
    assert (batch[0] == 7.0).all() and (batch[2] == 7.0).all()  # the other rows untouched
    alone = preprocess(image, 64, settings["mean"], settings["std"], channel_order=order)
    assert alone.flags.c_contiguous and np.array_equal(alone, want)


# -- the summary's latency percentiles -------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_percentiles_are_within_one_percent_of_numpys(seed):
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.lognormal(np.log(40), 0.3, 20000), rng.uniform(150, 900, 300)])  # ms, a slow tail
    hist = LogHistogram()
    for v in values:
        hist.add(float(v))
    for q in (1, 50, 90, 95, 99, 99.9):
        assert hist.percentile(q) == pytest.approx(np.percentile(values, q), rel=0.01), q
    assert (hist.percentile(0), hist.percentile(100)) == (values.min(), values.max())


def test_memory_does_not_grow_with_the_run_and_small_runs_are_exact_at_the_ends():
    hist = LogHistogram()
    assert hist.percentile(50) is None
    size = hist.counts.nbytes
    for v in (12.5, 80.0):
        hist.add(v)
    assert (hist.percentile(0), hist.percentile(100)) == (12.5, 80.0)
    for v in np.linspace(0.0, 5e7, 100000):  # beyond both ends: clamped into the first and last bins
        hist.add(float(v))
    assert hist.counts.nbytes == size < 20_000 and len(hist) == 100002
