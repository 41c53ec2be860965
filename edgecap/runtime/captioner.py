"""The Python API for a robot's own process: `Captioner.from_bundle(path).caption(frames)`.

    from edgecap.runtime.captioner import Captioner
    captioner = Captioner.from_bundle("bundle/", beam=3)
    for cap in captioner.caption([bgr_frame]):
        print(cap.text, cap.latency_ms)

Frames are OpenCV BGR uint8 images of any size; preprocessing is exactly the manifest's
(the bundle's `Preprocessing`, edgecap.contract.preprocess, which training and export use),
read once when the captioner is made: a frame parses nothing. The bundle's graphs have a
static batch: a short list is padded with zero images whose captions are discarded, a long
list is captioned in several batches. The image buffer is allocated once and reused; the
decoder's cache lives in the bundle's stepper, also allocated once (on a GPU, on the device).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from edgecap.contract.beam import DecodeOptions
from edgecap.errors import EdgecapError

STAGES = ("preprocess", "visual", "encoder", "decode")


@dataclass
class Caption:
    text: str
    tokens: list[int]                      # word ids, without BOS / EOS / padding
    latency_ms: dict[str, float] = field(default_factory=dict)  # per stage, for its batch
    beam: int = 1
    score: float = 0.0                     # summed log-probability of the caption


class Captioner:
    """Captions BGR frames with a loaded bundle (`edgecap.runtime.session.Bundle`)."""

    def __init__(self, bundle, beam: int | None = None, max_len: int | None = None,
                 length_penalty: float | None = None):
        if not bundle.has_visual:
            raise EdgecapError("this bundle reads precomputed features (no visual graph); "
                               "captioning camera frames needs a bundle exported from an image model")
        self.bundle = bundle
        self.max_beam = int(bundle.beam_size)
        self.beam = self.check_beam(self.max_beam if beam is None else beam)
        self.max_len = int(bundle.max_len if max_len is None else max_len)
        if not 1 <= self.max_len <= int(bundle.max_len):
            raise EdgecapError(f"max_len {self.max_len} out of range; the bundle's cache holds "
                               f"1..{bundle.max_len} tokens")
        self.length_penalty = float(bundle.decoding.length_penalty if length_penalty is None else length_penalty)
        self.preprocessing = bundle.preprocessing
        self.size = int(self.preprocessing.size)
        self.batch_size = int(bundle.batch_size)
        self._images = np.zeros((self.batch_size, 3, self.size, self.size), np.float32)
        self._special = {int(bundle.bos_id), int(bundle.eos_id), int(bundle.pad_id)}

    @classmethod
    def from_bundle(cls, path, beam: int | None = None, providers=None,
                    max_len: int | None = None, length_penalty: float | None = None,
                    threads: int = 0, spin: bool = True, engine: str = "auto", device_state: bool | None = None,
                    cuda_graph: bool = False) -> Captioner:
        """Load and verify a bundle (manifest, file hashes), then wrap it.

        providers: onnxruntime execution providers (default: the best installed);
        threads: onnxruntime intra-op threads (0: onnxruntime decides, one per physical core);
        spin: idle intra-op threads busy-wait (False: they sleep, costing latency, saving CPU);
        engine: auto | onnxruntime | tensorrt (Bundle.load);
        device_state / cuda_graph: where the decoding state lives and whether its steps are
        replayed as CUDA graphs (`Bundle.load`; docs/runtime.md, "Where the decoding state lives").
        """
        from .session import Bundle

        bundle = Bundle.load(path, providers=providers, threads=threads, spin=spin, engine=engine,
                             device_state=device_state, cuda_graph=cuda_graph)
        return cls(bundle, beam=beam, max_len=max_len, length_penalty=length_penalty)

    def check_beam(self, beam: int) -> int:
        """`beam` if the decoder graph can run it (1..its beams per image), else a clear error."""
        beam = int(beam)
        if not 1 <= beam <= self.max_beam:
            raise EdgecapError(f"beam {beam} out of range: this bundle's decoder graph was "
                               f"exported for beams 1..{self.max_beam} (export with a larger --beam)")
        return beam

    def warm_up(self) -> None:
        """One batch of zero images through every graph: session start-up and allocations
        happen here, not on the first real frame (whose latency would otherwise be inflated)."""
        self._images[:] = 0.0
        cross = self.bundle.encode_for_decoding(*self.bundle.visual(self._images))
        self.bundle.decode(cross, DecodeOptions(beam_size=self.beam, max_len=self.max_len))

    def preprocess_into(self, frames: list[np.ndarray]) -> np.ndarray:
        """Fill the reused [batch, 3, H, W] buffer; rows past len(frames) are zero padding."""
        for i, frame in enumerate(frames):
            self.preprocessing(frame, out=self._images[i])  # in place: no per-frame arrays
        self._images[len(frames):] = 0.0
        return self._images

    def caption(self, frames: list[np.ndarray], beam: int | None = None) -> list[Caption]:
        """One Caption per frame, in order."""
        beam = self.beam if beam is None else self.check_beam(beam)
        out: list[Caption] = []
        for start in range(0, len(frames), self.batch_size):
            out += self._caption_batch(frames[start:start + self.batch_size], beam)
        return out

    def _caption_batch(self, frames: list[np.ndarray], beam: int) -> list[Caption]:
        n = len(frames)
        t0 = time.perf_counter()
        images = self.preprocess_into(frames)
        t1 = time.perf_counter()
        feats, mask = self.bundle.visual(images)
        t2 = time.perf_counter()
        cross = self.bundle.encode_for_decoding(feats, mask)
        t3 = time.perf_counter()
        options = DecodeOptions(beam_size=beam, max_len=self.max_len,
                                length_penalty=self.length_penalty)
        hyp = self.bundle.decode(cross, options)
        texts = self.bundle.captions(hyp)
        t4 = time.perf_counter()
        latency = {"preprocess": (t1 - t0) * 1e3, "visual": (t2 - t1) * 1e3,
                   "encoder": (t3 - t2) * 1e3, "decode": (t4 - t3) * 1e3}
        best = np.asarray(hyp.tokens)[:, 0]
        lengths = np.asarray(hyp.lengths)[:, 0]
        scores = np.asarray(hyp.scores)[:, 0]
        caps = []
        for i in range(n):  # rows past n are padding: discarded here
            ids = [int(t) for t in best[i, :int(lengths[i])] if int(t) not in self._special]
            caps.append(Caption(texts[i], ids, dict(latency), beam, float(scores[i])))
        return caps
