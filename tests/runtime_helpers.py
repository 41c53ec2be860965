"""Test doubles for the runtime: a bundle-shaped numpy model and scripted frame sources."""

from __future__ import annotations

import signal
import subprocess
import time

import numpy as np

from edgecap.contract.beam import beam_search
from edgecap.contract.manifest import DecodingDefaults
from edgecap.contract.preprocess import Preprocessing
from edgecap.runtime.sources import BadFrame, Captured, EndOfStream, Source, StreamLost, make_source

WORDS = ["<pad>", "<bos>", "<eos>", "<unk>", "a", "red", "green", "blue", "cup", "bottle", "scene"]


class _Stepper:
    """Emits 'a <colour> <noun> <eos>' from the dominant channel of each row's image."""

    def __init__(self, cross, rows: int, beam: int):
        self.colour = np.repeat(cross[0], beam)   # [rows] index of the dominant channel
        self.reorders = 0

    def __call__(self, tokens, t):
        logp = np.full((len(tokens), len(WORDS)), -9.0)
        plan = [4, None, 8, 2]
        for r in range(len(tokens)):
            want = plan[min(t, 3)]
            if want is None:
                want = 5 + int(self.colour[r])
            logp[r, want] = -0.01
        return logp

    def reorder(self, rows):
        self.colour = self.colour[rows]
        self.reorders += 1


class FakeBundle:
    """The Bundle surface the Captioner uses, in numpy: static batch, beams as rows."""

    def __init__(self, batch_size=2, beam_size=3, size=32, delay=0.0):
        self.batch_size, self.beam_size = batch_size, beam_size
        self.itos = WORDS
        self.bos_id, self.eos_id, self.pad_id, self.max_len = 1, 2, 0, 6
        self.preprocessing = Preprocessing(size, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "bilinear", "RGB")
        self.decoding = DecodingDefaults(beam_size, self.max_len)
        self.has_visual = True
        self.delay = delay
        self.seen_batches = []

    def visual(self, images):
        assert images.shape == (self.batch_size, 3, self.preprocessing.size, self.preprocessing.size)
        assert images.dtype == np.float32
        self.seen_batches.append(images.copy())
        if self.delay:
            time.sleep(self.delay)
        return images.mean(axis=(2, 3))[:, None, :], np.ones((self.batch_size, 1), bool)

    def encode(self, feats, mask):
        return (feats[:, 0].argmax(axis=1),)

    encode_for_decoding = encode

    def decode(self, cross, options):
        assert options.beam_size <= self.beam_size
        stepper = _Stepper(cross, self.batch_size * options.beam_size, options.beam_size)
        return beam_search(stepper, self.batch_size, options, self.bos_id, self.eos_id, self.pad_id)

    def captions(self, hyp):
        out = []
        for row, n in zip(hyp.tokens[:, 0], hyp.lengths[:, 0], strict=True):
            out.append(" ".join(self.itos[t] for t in row[:n] if t > 3))
        return out


def solid(bgr, size=24) -> np.ndarray:
    image = np.zeros((size, size, 3), np.uint8)
    image[:] = bgr
    return image


class ScriptedSource(Source):
    """Frames from a script: an ndarray is a frame, (ndarray, objects) a frame with known
    objects, "bad" an undecodable one, "lost" a dropped stream (open() then fails `fail_opens`
    times before it comes back)."""

    def __init__(self, script, fps=None, live=False, fail_opens=0, name="scripted"):
        self.script = list(script)
        self.fps = fps
        self.live = live
        self.name = name
        self.fail_opens = fail_opens
        self.position = 0
        self.opens = 0
        self.closes = 0
        self.is_open = False
        self.handed_out = []

    def open(self):
        if self.opens > 0 and self.fail_opens > 0:
            self.fail_opens -= 1
            raise OSError("device still gone")
        self.opens += 1
        self.is_open = True

    def read(self):
        assert self.is_open, "read from a closed source"
        if self.position >= len(self.script):
            raise EndOfStream(self.name)
        index, item = self.position, self.script[self.position]
        self.position += 1
        if isinstance(item, str) and item == "bad":
            raise BadFrame(f"frame {index} garbled")
        if isinstance(item, str) and item == "lost":
            self.is_open = False
            raise StreamLost("cable pulled")
        image, objects = item if isinstance(item, tuple) else (item, None)
        self.handed_out.append(image)
        return Captured(image, None if self.live else index, objects)

    def close(self):
        self.closes += 1
        self.is_open = False


class EndlessSource(Source):
    """A numbered frame every read, forever (the frame's first pixel holds its number)."""

    def __init__(self, fps):
        self.fps = fps
        self.name = "endless"
        self.position = 0

    def open(self):
        pass

    def read(self):
        image = np.zeros((16, 16, 3), np.uint8)
        image[0, 0] = (self.position % 256, self.position // 256 % 256, 0)
        index = self.position
        self.position += 1
        return Captured(image, index)


def drain(source):
    """Read a source to its end: (captured frames, messages of the bad frames)."""
    good, bad = [], []
    while True:
        try:
            good.append(source.read())
        except BadFrame as exc:
            bad.append(str(exc))
        except EndOfStream:
            return good, bad


def read_frames(path, topic=None):
    """Read a log (or any source) at `path` to its end: (captured frames, bad-frame messages,
    the source's note)."""
    source = make_source(str(path), topic=topic)
    source.open()
    try:
        good, bad = drain(source)
    finally:
        source.close()
    return good, bad, source.note


def terminate_after_records(argv, jsonl, records=3, cwd=None, timeout=60.0):
    """Start `argv` (an `edgecap run ... --jsonl FILE`), send SIGTERM once FILE holds `records`
    lines, and return (exit code, stdout, stderr)."""
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=cwd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if jsonl.exists() and len(jsonl.read_text().splitlines()) >= records:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    return proc.returncode, stdout, stderr


def hidden_leftovers(directory):
    """Hidden names in `directory`: the work directories (or any other temporary) a writer left."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
