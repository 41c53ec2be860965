"""Frame sources: what each command-line string opens, and what each source reads."""

import cv2
import numpy as np
import pytest
from runtime_helpers import drain

from edgecap.errors import EdgecapError
from edgecap.runtime.sources import (
    SOURCE_HELP,
    ACVRSource,
    BadFrame,
    CaptureSource,
    FolderSource,
    SourceOpenError,
    StreamLost,
    SynthSource,
    make_source,
    masked,
    open_source,
)


@pytest.fixture(scope="module")
def synth_data(tmp_path_factory):
    from edgecap.data.synth import generate_dataset

    out = tmp_path_factory.mktemp("synth") / "data"
    generate_dataset(out, n_images=4, seed=3, size=64, sequences=1, frames_per_sequence=5,
                     video_frames=12, progress=False)
    return out


def test_folder_reads_images_in_name_order_and_skips_undecodable(tmp_path):
    for i, colour in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        img = np.zeros((20, 30, 3), np.uint8)
        img[:] = colour
        cv2.imwrite(str(tmp_path / f"img{i}.png"), img)
    (tmp_path / "img1b.jpg").write_bytes(b"not a jpeg at all")
    (tmp_path / "notes.txt").write_text("ignored")
    source = open_source(str(tmp_path))
    assert isinstance(source, FolderSource)
    good, bad = drain(source)
    assert [c.image_id for c in good] == ["img0.png", "img1.png", "img2.png"]
    assert [c.index for c in good] == [0, 1, 3]  # the bad file keeps its place in the order
    assert good[1].image[0, 0].tolist() == [0, 255, 0]
    assert len(bad) == 1 and "img1b.jpg" in bad[0]


def test_acvr_sequence_frames_carry_ground_truth(synth_data):
    seq = synth_data / "acvr" / "000000"
    source = open_source(str(seq))
    assert isinstance(source, ACVRSource)
    good, bad = drain(source)
    assert len(good) == 5 and not bad
    first = good[0]
    assert first.image_id == "000000/000000"
    assert first.image.shape == (64, 64, 3)
    assert first.objects, "ACVR frames must carry their objects"
    for obj in first.objects:
        left, top, right, bottom = obj.box
        assert 0 <= left <= right < 64 and 0 <= top <= bottom < 64
        assert 0 < obj.area <= 1
    # The root with sequence folders under it is an ACVR source too.
    assert isinstance(make_source(str(synth_data / "acvr")), ACVRSource)


def test_acvr_background_instances_are_not_objects_in_view(tmp_path):
    """The challenge keeps its `none` instances; a frame's objects to name leave them out, and
    their area is the box's, as SMArT's coverage thresholds use."""
    import json

    seq = tmp_path / "000000"
    seq.mkdir()
    cv2.imwrite(str(seq / "000000.png"), np.zeros((20, 40, 3), np.uint8))
    (seq / "labels.json").write_text(json.dumps({"000000": {
        "_metadata": {"width": 40, "height": 20},
        "1": {"class": "bg", "bounding_box": [0, 0, 39, 19]},
        "2": {"class": "cup", "bounding_box": [0, 0, 9, 7], "num_pixels": 3}}}))
    good, _ = drain(open_source(str(seq)))
    assert [(o.cls, o.area) for o in good[0].objects] == [("cup", 80 / 800)]


def test_video_file_reads_every_frame_then_ends(synth_data):
    video = synth_data / "video" / "tabletop.mp4"
    source = open_source(str(video))
    assert isinstance(source, CaptureSource) and not source.live
    assert source.fps == pytest.approx(15.0)
    good, bad = drain(source)
    assert [c.index for c in good] == list(range(12)) and not bad
    source.close()


def test_synth_url_renders_the_live_world():
    from edgecap.data.synth import TabletopWorld

    source = open_source("synth://tabletop?seed=5&size=48&fps=10")
    assert isinstance(source, SynthSource) and source.fps == 10
    frames = [source.read() for _ in range(3)]
    image, objects = TabletopWorld(5, 48, 10).render_frame(2)
    assert np.array_equal(frames[2].image, image)
    assert [o.cls for o in frames[2].objects] == [o["class"] for o in objects]
    assert frames[2].index == 2
    # scene=SECONDS: a new table every second at 10 fps -> frames 9 and 10 differ in scene.
    quick = open_source("synth://tabletop?seed=5&size=48&fps=10&scene=1")
    assert quick.world.scene_index(9) == 0 and quick.world.scene_index(10) == 1


@pytest.mark.parametrize("spec, message", [
    ("synth://kitchen", "unknown synthetic world"),
    ("synth://tabletop?size=abc", "is not a int"),
    ("synth://tabletop?zoom=2", "unknown parameter 'zoom'"),
    ("synth://tabletop?fps=0", "fps=0 out of range"),
    ("synth://tabletop?fps=nan", "fps=nan out of range"),
    ("/no/such/place.mp4", "no such file or directory"),
])
def test_bad_source_strings_give_one_line_errors(spec, message):
    with pytest.raises(SourceOpenError, match=message) as info:
        open_source(spec)
    assert "\n" not in str(info.value)


def test_run_with_a_fifo_or_dev_null_as_source_says_what_it_is(tmp_path):
    """Both were "no such file or directory", though they are there."""
    import os

    os.mkfifo(tmp_path / "frames.pipe")
    with pytest.raises(SourceOpenError, match=r"is a named pipe \(FIFO\), which OpenCV cannot open as a video: "
                                              r"write the stream to a file, or serve it as a URL"):
        open_source(str(tmp_path / "frames.pipe"))
    with pytest.raises(SourceOpenError) as info:
        open_source("/dev/null")
    assert str(info.value) == ("source '/dev/null' is a character device, not a camera (a video4linux camera is "
                               f"/dev/videoN); expected {SOURCE_HELP}")


def test_unopenable_video_and_camera_are_open_errors(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(SourceOpenError, match="cannot open video"):
        open_source(str(junk))
    with pytest.raises(EdgecapError, match="no images"):
        (tmp_path / "empty").mkdir()
        open_source(str(tmp_path / "empty"))
    (tmp_path / "split" / "val2014").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "split" / "val2014" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(EdgecapError, match="its subfolders val2014 do: give one of them"):
        open_source(str(tmp_path / "split"))


def test_a_source_that_will_not_open_prints_only_our_one_line(tmp_path, capfd, monkeypatch):
    """OpenCV's [ WARN ] lines and FFmpeg's own messages went to the console before our error;
    now FFmpeg's reason is quoted in it and nothing else is printed."""
    import os

    monkeypatch.delenv("OPENCV_LOG_LEVEL", raising=False)
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"garbage, not a video")
    capfd.readouterr()
    with pytest.raises(SourceOpenError) as info:
        open_source(str(junk))
    assert "moov atom not found" in str(info.value)  # FFmpeg's reason, quoted
    camera = next(i for i in range(40, 100) if not os.path.exists(f"/dev/video{i}"))
    with pytest.raises(SourceOpenError) as info:
        open_source(str(camera))
    assert f"cannot open camera 'camera {camera}'" in str(info.value)
    assert f"there is no /dev/video{camera}" in str(info.value)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


class _FailingCapture:
    """cv2.VideoCapture stand-in: a real capture whose grab() fails once at one frame, and
    whose retrieve() fails at another."""

    def __init__(self, real, fail_grab_at, fail_retrieve_at, state):
        self.real, self.state = real, state
        self.fail_grab_at, self.fail_retrieve_at = fail_grab_at, fail_retrieve_at

    def __getattr__(self, name):
        return getattr(self.real, name)

    def grab(self):
        pos = int(self.real.get(cv2.CAP_PROP_POS_FRAMES))
        if pos == self.fail_grab_at and not self.state["grab_failed"]:
            self.state["grab_failed"] = True
            return False
        return self.real.grab()

    def retrieve(self):
        ok, image = self.real.retrieve()
        pos = int(self.real.get(cv2.CAP_PROP_POS_FRAMES)) - 1
        return (False, None) if pos == self.fail_retrieve_at else (ok, image)


def test_video_read_failure_mid_file_is_a_lost_stream_resumed_at_its_position(synth_data):
    video = str(synth_data / "video" / "tabletop.mp4")
    state = {"grab_failed": False}

    class Flaky(CaptureSource):
        def _capture(self):
            return _FailingCapture(cv2.VideoCapture(self.target), 5, 8, state)

    source = Flaky(video, "video")
    source.open()
    got = []
    with pytest.raises(StreamLost, match="frame 5 of 12"):
        while True:
            try:
                got.append(source.read().index)
            except BadFrame:
                got.append("bad")
    source.close()
    source.open()  # what the capture thread does, after a back-off
    good, bad = drain(source)
    got += [c.index for c in good]
    assert got == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]
    assert len(bad) == 1 and "frame 8" in bad[0]


def test_an_unreachable_stream_says_what_was_tried_and_what_to_check(capfd, monkeypatch):
    """Nothing listens on port 1: one line naming the URL (password masked), the backend, the
    library's reason, the open timeout and what to check; nothing else on the console."""
    monkeypatch.delenv("OPENCV_LOG_LEVEL", raising=False)
    capfd.readouterr()
    with pytest.raises(SourceOpenError) as info:
        open_source("rtsp://admin:hunter2@127.0.0.1:1/x")
    message = str(info.value)
    assert "\n" not in message and "hunter2" not in message
    assert message.startswith("cannot open stream 'rtsp://admin:***@127.0.0.1:1/x' with OpenCV's FFMPEG backend (")
    assert "Connection refused" in message and "open timeout 10 s" in message
    assert message.endswith("the URL's path and the user name and password; ffprobe URL shows what FFmpeg sees")
    assert capfd.readouterr().err == ""


def test_streams_open_with_a_timeout_and_files_with_any_backend(monkeypatch):
    """A stream is opened through FFmpeg with OpenCV's open (and read) timeout, so an
    unreachable camera fails in seconds instead of when the OS gives up on the connect."""
    calls = []

    class Unopened:
        def __init__(self, *args):
            calls.append(args)

        def isOpened(self):
            return False

        def release(self):
            pass

    monkeypatch.setattr(cv2, "VideoCapture", Unopened)
    with pytest.raises(SourceOpenError, match="open timeout 10 s"):
        CaptureSource("rtsp://10.0.0.5/stream", "stream").open()
    url, api, params = calls[-1]
    assert (url, api) == ("rtsp://10.0.0.5/stream", cv2.CAP_FFMPEG)
    settings = dict(zip(params[::2], params[1::2], strict=True))
    assert settings == {cv2.CAP_PROP_OPEN_TIMEOUT_MSEC: 10000, cv2.CAP_PROP_READ_TIMEOUT_MSEC: 10000}
    with pytest.raises(SourceOpenError, match=r"with OpenCV \(backends tried: .*FFMPEG.*\): check that the file"):
        CaptureSource("clip.mp4", "video").open()
    assert calls[-1] == ("clip.mp4", cv2.CAP_ANY)


@pytest.mark.parametrize("source, shown", [
    ("rtsp://admin:s3cret@10.0.0.5:554/Streaming/101?transport=tcp", "rtsp://admin:***@10.0.0.5:554/Streaming/101?transport=tcp"),
    ("rtsp://admin:p@ss@10.0.0.5/s", "rtsp://admin:***@10.0.0.5/s"),  # an unescaped @ in the password
    ("http://viewer@cam.local/mjpg", "http://viewer@cam.local/mjpg"),  # no password
    ("rtsp://10.0.0.5/stream", "rtsp://10.0.0.5/stream"),
    ("/data/run:1/clip.mp4", "/data/run:1/clip.mp4"),
    ("0", "0"),
])
def test_a_url_password_is_masked_wherever_the_source_is_shown(source, shown):
    assert masked(source) == shown
