"""The runtime on a real exported bundle: preprocessing parity with the checkpoint, caption
identity with PyTorch, `edgecap run` from a video, an image folder and an ACVR sequence,
SIGTERM, bad sources, the latency budget, and a torch-free captioning process.

A manifest whose vocabulary does not match the decoder graph's output (edited, or put beside
another export's graphs) is refused in one line when the bundle opens, not an IndexError while
captioning.

What `edgecap run` says matches what it did: under --pace every no frame is dropped (the
frame read ahead when --frames stops the run was counted as one), and --jsonl r.jsonl writes
its summary to r.summary.json, as docs/runtime.md says.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from runtime_helpers import terminate_after_records

torch = pytest.importorskip("torch")

from edgecap.contract.manifest import ManifestError  # noqa: E402
from edgecap.contract.preprocess import preprocess  # noqa: E402
from edgecap.runtime.captioner import Captioner  # noqa: E402
from edgecap.runtime.session import Bundle  # noqa: E402
from tests._export_util import cnn_bundle  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Non-default preprocessing on purpose: a manifest that dropped the resize filter, channel order
# or normalisation would change the runtime's input, and the parity test below would see it.
VISUAL = {"kind": "cnn", "image_size": 16, "channels": [8, 24], "resize": "area",
          "channel_order": "BGR", "mean": [0.2, 0.3, 0.4], "std": [0.5, 0.6, 0.7]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(checkpoint, bundle) of a tiny SMArT with a CNN front end; batch 2, beam 2."""
    from tests._export_util import export, save_tiny

    root = tmp_path_factory.mktemp("bundle")
    ckpt = save_tiny(root / "tiny.pt", "smart", visual=VISUAL, n_regions=16)
    export(ckpt, root / "bundle")
    return ckpt, root / "bundle"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from edgecap.data.synth import generate_dataset

    out = tmp_path_factory.mktemp("synth") / "data"
    generate_dataset(out, n_images=6, seed=1, size=64, sequences=1, frames_per_sequence=4,
                     video_frames=10, progress=False)
    return out


def _frames(n=3, size=64):
    from edgecap.data.synth import TabletopWorld

    world = TabletopWorld(seed=2, size=size, scene_seconds=0.1)
    return [world.render_frame(t * 7)[0] for t in range(n)]


def test_runtime_preprocessing_equals_the_checkpoints_visual_config(tiny):
    from edgecap.models.checkpoint import load_checkpoint

    ckpt, bundle = tiny
    vc = load_checkpoint(ckpt).config.visual
    captioner = Captioner.from_bundle(bundle)
    assert (captioner.size, captioner.preprocessing.resize, captioner.preprocessing.channel_order) == (16, "area", "BGR")
    for frame in _frames(2):
        runtime = captioner.preprocess_into([frame])[0]
        export_time = preprocess(frame, vc.image_size, vc.mean, vc.std, vc.resize, vc.channel_order)
        np.testing.assert_array_equal(runtime, export_time)
        # The check can fail: another filter alone gives a different input.
        other = preprocess(frame, vc.image_size, vc.mean, vc.std, "bilinear", vc.channel_order)
        assert not np.array_equal(runtime, other)


@pytest.mark.parametrize("beam", [1, 2])
def test_numpy_runtime_captions_are_token_identical_to_pytorch(tiny, beam):
    from edgecap.contract.beam import DecodeOptions
    from edgecap.models.checkpoint import load_checkpoint
    from edgecap.models.decoding import generate

    ckpt_path, bundle = tiny
    ckpt = load_checkpoint(ckpt_path)
    vc, cfg = ckpt.config.visual, ckpt.config
    frames = _frames(3)  # 3 frames on a batch-2 bundle: one full batch, one padded
    caps = Captioner.from_bundle(bundle, beam=beam).caption(frames)
    x = torch.from_numpy(np.stack([preprocess(f, vc.image_size, vc.mean, vc.std, vc.resize,
                                              vc.channel_order) for f in frames]))
    with torch.no_grad():
        feats, mask = ckpt.model.visual(x)
        hyp = generate(ckpt.model, feats, mask, DecodeOptions(beam_size=beam, max_len=cfg.max_len))
    special = {cfg.bos_id, cfg.eos_id, cfg.pad_id}
    for i, cap in enumerate(caps):
        n = int(hyp.lengths[i, 0])
        expected = [int(t) for t in hyp.tokens[i, 0, :n] if int(t) not in special]
        assert cap.tokens == expected, f"frame {i}, beam {beam}"
        assert cap.text == " ".join(ckpt.vocab.itos[t] for t in expected)
        assert cap.beam == beam


def _records(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_run_from_a_video_file_with_its_ground_truth_sidecar(tiny, synth, tmp_path, run_cli):
    video = synth / "video" / "tabletop.mp4"
    out = tmp_path / "video.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", video, "--pace", "every",
                                   "--detections", synth / "video" / "tabletop.jsonl",
                                   "--no-coverage", "--jsonl", out, "--save-video", tmp_path / "v.mp4")
    assert code == 0, stderr
    recs = _records(out)
    assert [r["frame_id"] for r in recs] == list(range(10))
    sidecar = [json.loads(x) for x in (synth / "video" / "tabletop.jsonl").read_text().splitlines()]
    assert [o["class"] for o in recs[3]["objects"]] == [o["class"] for o in sidecar[3]["objects"]]
    assert "coverage" not in recs[0]
    assert "summary: 10 frames captioned, 0 dropped" in stdout
    assert (tmp_path / "v.mp4").stat().st_size > 0


def test_run_from_a_video_at_native_pace_counts_drops(tiny, synth, tmp_path, run_cli):
    out = tmp_path / "native.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", synth / "video" / "tabletop.mp4",
                                   "--source-fps", "200", "--jsonl", out, "--quiet")
    assert code == 0, stderr
    summary = json.loads((tmp_path / "native.summary.json").read_text())
    assert summary["frames_captured"] == 10
    assert summary["frames_captioned"] + summary["frames_dropped"] == 10
    assert summary["frames_captioned"] == len(_records(out)) >= 1
    assert "[" not in stdout.split("summary:")[0]  # --quiet: no per-caption lines


def test_run_from_an_image_folder(tiny, synth, tmp_path, run_cli):
    folder = synth / "images" / "train2014"
    names = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "folder.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", folder, "--jsonl", out, "--batch", "2")
    assert code == 0, stderr
    recs = _records(out)
    assert [r["image_id"] for r in recs] == names
    assert all(r["caption"] and r["tokens"] for r in recs)
    assert set(recs[0]["latency_ms"]) == {"preprocess", "visual", "encoder", "decode"}
    assert f"summary: {len(names)} frames captioned, 0 dropped, 0 skipped" in stdout


def test_run_from_an_acvr_sequence_scores_coverage_and_feeds_eval(tiny, synth, tmp_path, run_cli):
    pytest.importorskip("spacy")
    seq = synth / "acvr" / "000000"
    out = tmp_path / "acvr.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", seq, "--jsonl", out)
    assert code == 0, stderr
    recs = _records(out)
    assert [r["image_id"] for r in recs] == [f"000000/{i:06d}" for i in range(4)]
    for r in recs:
        assert set(r["coverage"]) == {">1%", ">3%", ">5%", ">10%"}
        assert r["objects"] and all(0 < o["area"] <= 1 for o in r["objects"])
    assert "mean coverage (box area > threshold): >1%" in stdout
    # The records are an `edgecap eval coverage` input as they are, and it scores them by the
    # same rule (box areas, "> t"): the same means as the run's own.
    code, stdout, stderr = run_cli("eval", "coverage", "--captions", out, "--acvr", synth / "acvr",
                                   "--out", tmp_path / "report", "--no-plot")
    assert code == 0, stderr
    report = json.loads((tmp_path / "report" / "coverage.json").read_text())
    (evaluated,) = [f["summary"]["thresholds"] for f in report["files"].values()]
    run_means = json.loads((tmp_path / "acvr.summary.json").read_text())["coverage_mean"]
    assert run_means == {k: pytest.approx(v["mean"], abs=1e-6) for k, v in evaluated.items()}


def test_latency_budget_lowers_the_beam(tiny, synth, tmp_path, run_cli):
    out = tmp_path / "budget.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", synth / "video" / "tabletop.mp4",
                                   "--pace", "every", "--jsonl", out, "--latency-budget", "0.001")
    assert code == 0, stderr
    # An impossible budget: beam 2 for the first window of 4 frames, then greedy for good.
    assert [r["beam"] for r in _records(out)] == [2] * 4 + [1] * 6
    assert json.loads((tmp_path / "budget.summary.json").read_text())["beam_changes"] == 1


@pytest.mark.parametrize("source, message", [
    ("/no/such/video.mp4", "no such file or directory"),
    ("synth://tabletop?fps=fast", "is not a float"),
])
def test_source_that_fails_to_open_is_one_line_and_exit_1(tiny, run_cli, source, message):
    code, stdout, stderr = run_cli("run", tiny[1], "--source", source)
    assert code == 1
    assert stderr.count("\n") == 1 and message in stderr and stderr.startswith("edgecap run: error:")


def test_bad_beam_is_refused(tiny, synth, run_cli):
    code, _, stderr = run_cli("run", tiny[1], "--source", synth / "images" / "train2014", "--beam", "5")
    assert code == 1 and "beams 1..2" in stderr


def test_sigterm_stops_cleanly_with_summary_and_valid_jsonl(tiny, synth, tmp_path):
    folder = tmp_path / "many"
    folder.mkdir()
    src = sorted((synth / "images" / "train2014").iterdir())
    for i in range(200):
        (folder / f"{i:04d}.jpg").write_bytes(src[i % len(src)].read_bytes())
    out = tmp_path / "term.jsonl"
    code, stdout, stderr = terminate_after_records(
        [sys.executable, "-m", "edgecap.cli", "run", tiny[1], "--source", folder,
         "--pace", "native", "--source-fps", "20", "--jsonl", out], out, cwd=REPO)
    assert code == 0, stderr
    assert "stopped by signal" in stdout and "summary:" in stdout
    lines = out.read_text().splitlines()
    recs = [json.loads(line) for line in lines]  # every line complete and valid
    assert 3 <= len(recs) < 200
    summary = json.loads((tmp_path / "term.summary.json").read_text())
    assert summary["frames_captioned"] == len(recs) and summary["stopped_by"] == "signal"


_CAPTION_PROCESS = """
import sys, io, json
{block}
from edgecap.runtime.captioner import Captioner
from edgecap.runtime.command import RunSettings, execute
cap = Captioner.from_bundle({bundle!r})
execute(cap, RunSettings(source={source!r}, frames=2, jsonl={jsonl!r}, coverage={coverage}),
        out=io.StringIO())
heavy = sorted(m for m in sys.modules if sys.modules[m] is not None and (
               m.split('.')[0] in ('torch', 'open_clip', 'torchvision')
               or m.startswith(('edgecap.models', 'edgecap.train', 'edgecap.export'))))
print(json.dumps(heavy))
"""


def _caption_process(tiny, synth, jsonl, coverage, block=""):
    code = _CAPTION_PROCESS.format(block=block, bundle=str(tiny[1]), jsonl=str(jsonl),
                                   source=str(synth / "acvr" / "000000"), coverage=coverage)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env=dict(os.environ), timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), _records(jsonl)


def test_captioning_process_never_imports_torch(tiny, synth, tmp_path):
    heavy, recs = _caption_process(tiny, synth, tmp_path / "a.jsonl", coverage=False)
    assert heavy == [] and len(recs) == 2


def test_captioning_with_coverage_works_where_torch_is_not_installed(tiny, synth, tmp_path):
    """spaCy's thinc imports torch whenever it is installed (so with coverage on, torch shows up
    in this dev environment's sys.modules, not through edgecap). A robot has no torch: make it
    unimportable and check that captioning and coverage still run."""
    pytest.importorskip("spacy")
    heavy, recs = _caption_process(tiny, synth, tmp_path / "b.jsonl", coverage=True,
                                   block="sys.modules['torch'] = None  # import torch -> ImportError")
    assert heavy == []
    assert all(set(r["coverage"]) == {">1%", ">3%", ">5%", ">10%"} for r in recs)


def test_video_overlay_highlights_mentioned_objects():
    from edgecap.runtime.camera import Frame
    from edgecap.runtime.captioner import Caption
    from edgecap.runtime.overlay import GREEN, GREY, annotate
    from edgecap.runtime.records import Record
    from edgecap.runtime.sources import KnownObject

    image = np.full((64, 64, 3), 90, np.uint8)
    objects = [KnownObject("cup", (4, 4, 20, 20), 0.06), KnownObject("bowl", (30, 30, 60, 60), 0.2)]
    rec = Record(Frame(image, 0, 0.0, 0.0, objects), Caption("a cup", [5]), "x", 0.01,
                 coverage={">1%": 0.5}, matches=[{"noun": "cup", "class": "cup", "profit": 1.0, "exact": True}])
    out = annotate(rec)
    scale = out.shape[1] / 64
    assert out.shape[1] == 512 and out.shape[0] > 512  # caption band below the frame
    assert tuple(out[int(4 * scale), int(12 * scale)]) == GREEN  # the cup's top edge
    assert tuple(out[int(30 * scale), int(45 * scale)]) == GREY  # the unmentioned bowl


def test_sleeping_threads_caption_the_same_as_spinning_ones(tiny):
    # spin=False is the robot's choice when other processes need the cores between steps;
    # it must reach onnxruntime and change nothing but timing.
    _, bundle = tiny
    frames = _frames(2)
    spinning = Captioner.from_bundle(bundle, threads=2)
    sleeping = Captioner.from_bundle(bundle, threads=2, spin=False)
    config = lambda c: {role: g.session.get_session_options().get_session_config_entry(  # noqa: E731
        "session.intra_op.allow_spinning") for role, g in c.bundle._graphs.items()}
    assert set(config(spinning).values()) == {"1"} and set(config(sleeping).values()) == {"0"}
    assert [c.tokens for c in sleeping.caption(frames)] == [c.tokens for c in spinning.caption(frames)]


@pytest.mark.parametrize("how", ["flag", "config"])
def test_run_no_spin_reaches_every_session(tiny, synth, tmp_path, run_cli, monkeypatch, how):
    """docs/runtime.md tells robots that share their cores to try sleeping threads: `edgecap
    run --no-spin` (or `spin = false` in the runtime config) must reach onnxruntime."""
    made = []
    original = Captioner.from_bundle.__func__

    def spy(cls, *args, **kwargs):
        made.append(original(cls, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(Captioner, "from_bundle", classmethod(spy))
    argv = ["run", tiny[1], "--source", synth / "images" / "train2014", "--frames", "2", "--quiet"]
    if how == "flag":
        argv.append("--no-spin")
    else:
        (tmp_path / "run.toml").write_text("spin = false\n")
        argv += ["--config", tmp_path / "run.toml"]
    code, _, stderr = run_cli(*argv)
    assert code == 0, stderr
    spinning = {g.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
                for g in made[0].bundle._graphs.values()}
    assert spinning == {"0"}


_IDLE_PROCESS = """
import json, sys, time
import numpy as np
from edgecap.runtime.captioner import Captioner
cap = Captioner.from_bundle(sys.argv[1], threads=2)
frames = [np.random.default_rng(i).integers(0, 255, (48, 64, 3), dtype=np.uint8) for i in range(2)]
for _ in range(3):
    cap.caption(frames)
time.sleep(1.0)  # OpenCV's first INTER_AREA resize starts a one-off background job (~100 ms of CPU)
cap.caption(frames)
cpu = time.process_time()
time.sleep(0.3)
print(json.dumps({"idle_cpu_ms": (time.process_time() - cpu) * 1e3}))
"""


def test_spinning_threads_sleep_once_a_caption_is_done(tiny):
    """Between frames the captioner's threads must leave the cores to the camera, ROS and the
    next graph: onnxruntime's threads spin after a run by default (about 40 ms of CPU after
    every caption of the mobilenet + SMArT bundle, and a 36 ms decode took 83 ms because the
    visual and encoder graphs' threads were still spinning). A fresh process, so that no other
    test's sessions are in it."""
    res = subprocess.run([sys.executable, "-c", _IDLE_PROCESS, str(tiny[1])], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.strip().splitlines()[-1])["idle_cpu_ms"] < 10.0


def test_decoding_reuses_its_buffers_across_frames_without_leaking_state(tiny):
    from edgecap.contract.beam import DecodeOptions
    from edgecap.runtime.session import Bundle

    _, bundle_dir = tiny
    bundle = Bundle.load(bundle_dir)
    size = bundle.preprocessing.size
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((bundle.batch_size, 3, size, size)).astype(np.float32) for _ in range(2)]
    options = DecodeOptions(beam_size=bundle.beam_size, max_len=bundle.max_len)
    first = bundle.decode(bundle.encode(*bundle.visual(images[0])), options)
    stepper = bundle._steppers[bundle.beam_size]
    buffers = [id(b) for b in (*stepper.cross.values(), *(g.cache for g in stepper.groups), *stepper.outputs)]
    second = bundle.decode(bundle.encode(*bundle.visual(images[1])), options)
    assert bundle._steppers[bundle.beam_size] is stepper
    assert [id(b) for b in (*stepper.cross.values(), *(g.cache for g in stepper.groups), *stepper.outputs)] == buffers
    fresh = Bundle.load(bundle_dir)
    expected = fresh.decode(fresh.encode(*fresh.visual(images[1])), options)
    assert (second.tokens == expected.tokens).all()
    again = bundle.decode(bundle.encode(*bundle.visual(images[0])), options)
    assert (again.tokens == first.tokens).all()


@pytest.mark.parametrize("argv, message", [
    (["--jsonl", "/proc/edgecap-x.jsonl"], "--jsonl /proc/edgecap-x.jsonl: cannot create files in /proc"),
    (["--save-video", "/proc/edgecap-x.mp4"], "--save-video /proc/edgecap-x.mp4: cannot create files in /proc"),
    (["--save-video", "{tmp}/vid.txt"], "--save-video {tmp}/vid.txt: OpenCV cannot write video into a .txt file"),
    (["--jsonl", "{tmp}"], "--jsonl {tmp} is a directory"),
    (["--providers", "Bogus"], "unknown onnxruntime execution provider 'Bogus'"),
    (["--providers", "cpu"], "(did you mean 'CPUExecutionProvider'?)"),
])
def test_outputs_and_providers_that_cannot_work_fail_before_captioning(tiny, synth, tmp_path, run_cli, argv,
                                                                       message):
    if "/proc" in " ".join(argv) and not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, stdout, stderr = run_cli("run", tiny[1], "--source", synth / "images" / "train2014", *argv)
    assert (code, stdout) == (1, ""), stderr
    assert stderr.count("\n") == 1 and message.format(tmp=tmp_path) in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_provider_this_onnxruntime_lacks_is_an_error_not_a_cpu_run(tiny, synth, run_cli):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    code, stdout, stderr = run_cli("run", tiny[1], "--source", synth / "images" / "train2014",
                                   "--providers", "CUDAExecutionProvider,CPUExecutionProvider")
    assert (code, stdout) == (1, "")
    assert "execution provider CUDAExecutionProvider is not available" in stderr and 'edgecap[gpu]' in stderr
    code, _, stderr = run_cli("run", tiny[1], "--source", synth / "images" / "train2014", "--frames", "1",
                              "--providers", "CPUExecutionProvider")
    assert code == 0, stderr


def test_a_source_of_only_undecodable_frames_is_a_failure(tiny, tmp_path, run_cli):
    folder = tmp_path / "broken"
    folder.mkdir()
    for name in ("a.jpg", "b.png"):
        (folder / name).write_text("not an image")
    out = tmp_path / "captions.jsonl"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", folder, "--jsonl", out)
    assert code == 1
    assert stderr.strip().splitlines()[-1] == (
        f"edgecap run: error: --source {folder} ended without a frame captioned (2 frames could not be decoded)")
    assert "summary: 0 frames captioned" in stdout
    assert json.loads((tmp_path / "captions.summary.json").read_text())["frames_skipped"] == 2


def test_save_video_writes_the_container_its_suffix_names(tiny, synth, tmp_path, run_cli):
    import cv2

    video = tmp_path / "captions.mkv"
    code, stdout, stderr = run_cli("run", tiny[1], "--source", synth / "images" / "train2014", "--frames", "3",
                                   "--save-video", video)
    assert code == 0, stderr
    assert f"video: {video}" in stdout
    assert int(cv2.VideoCapture(str(video)).get(cv2.CAP_PROP_FRAME_COUNT)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.mkv"]


def test_run_given_a_checkpoint_says_to_export_it(tiny, run_cli):
    code, _, stderr = run_cli("run", tiny[0], "--source", "synth://tabletop", "--frames", "1")
    assert code == 1 and stderr.count("\n") == 1
    assert f"{tiny[0]} is a checkpoint, not a bundle: export it first (edgecap export {tiny[0]} --target" in stderr


@pytest.mark.parametrize("source, expected", [
    ("rtsp://admin:hunter2@127.0.0.1:1/x",
     "cannot open stream 'rtsp://admin:***@127.0.0.1:1/x' with OpenCV's FFMPEG backend ("),
    ("missing.mp4", "source 'missing.mp4': no such file or directory"),
])
def test_a_source_that_cannot_open_is_one_line_and_exit_1(tiny, source, expected, run_cli, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_cli("run", tiny[1], "--source", source, "--jsonl", "run.jsonl")
    assert code == 1 and stdout == ""
    assert stderr.count("\n") == 1 and stderr.startswith(f"edgecap run: error: {expected}")
    assert "hunter2" not in stderr and not (tmp_path / "run.jsonl").exists()


# -- a vocabulary that does not match the decoder graph --------------------------------------------
@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vocab")
    return cnn_bundle(root)


@pytest.mark.parametrize("change", [-3, 2], ids=["shorter", "longer"])
def test_a_vocabulary_of_another_size_is_refused_when_the_bundle_opens(bundle_dir, tmp_path, run_cli, change):
    copy = tmp_path / "b"
    shutil.copytree(bundle_dir, copy)
    data = json.loads((copy / "manifest.json").read_text())
    itos = data["vocab"]["itos"]
    words = len(itos)
    data["vocab"]["itos"] = itos[:change] if change < 0 else itos + [f"extra{i}" for i in range(change)]
    (copy / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="come from different exports"):
        Bundle.load(copy)
    images = tmp_path / "images"
    images.mkdir()
    cv2.imwrite(str(images / "a.png"), np.full((16, 16, 3), 90, np.uint8))
    code, stdout, stderr = run_cli("run", copy, "--source", images)
    assert (code, stdout) == (1, "")
    assert stderr.strip().splitlines() == [
        f"edgecap run: error: {copy / 'manifest.json'}.vocab: {words + change} words, but decoder_step.onnx "
        f"scores {words} tokens per step (output 'logprobs' [4, {words}]); the vocabulary and the graph come "
        "from different exports"]


# -- what edgecap run says matches what it did -----------------------------------------------------
@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from tests._export_util import cnn_bundle

    return cnn_bundle(tmp_path_factory.mktemp("words"))


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    from edgecap.data.synth import generate_dataset

    out = tmp_path_factory.mktemp("words-world") / "data"
    generate_dataset(out, n_images=1, seed=1, size=32, sequences=0, video_frames=20, progress=False)
    return out / "video" / "tabletop.mp4"


@pytest.mark.parametrize("source", ["video", "synth://tabletop?seed=1&size=32"])
def test_pace_every_drops_nothing_when_frames_stops_the_run(bundle, video, tmp_path, run_cli, source):
    source = str(video) if source == "video" else source
    log = tmp_path / "r.jsonl"
    code, stdout, stderr = run_cli("run", bundle, "--source", source, "--pace", "every", "--frames", 6,
                                   "--jsonl", log, "--quiet")
    assert code == 0, stderr
    assert "summary: 6 frames captioned, 0 dropped," in stdout
    summary = json.loads((tmp_path / "r.summary.json").read_text())  # r.jsonl -> r.summary.json
    assert (summary["frames_captioned"], summary["frames_dropped"], summary["frames_captured"]) == (6, 0, 6)
    assert f"summary: {tmp_path / 'r.summary.json'}" in stdout
    assert not (tmp_path / "r.jsonl.summary.json").exists()


def test_the_docs_name_the_summary_file_the_run_writes():
    from pathlib import Path

    runtime = (Path(__file__).resolve().parents[1] / "docs" / "runtime.md").read_text()
    assert "`--jsonl r.jsonl` writes `r.summary.json`" in runtime
    assert "FILE.summary.json" not in runtime
