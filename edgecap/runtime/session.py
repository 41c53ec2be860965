"""`Bundle`: a loaded export bundle, torch-free (numpy, onnxruntime; TensorRT when present).

    bundle = Bundle.load("bundle/")
    feats, mask = bundle.visual(images)            # float32 [batch, 3, H, W]
    cross = bundle.encode(feats, mask)              # numpy; encode_for_decoding keeps them on a GPU
    hyp = bundle.decode(cross, DecodeOptions(beam_size=3, max_len=bundle.max_len))
    bundle.captions(hyp)

Every graph has a static batch: the visual and encoder graphs take exactly `batch_size` images,
the decoder step `batch_size * beam_size` rows (the beams of an image are consecutive rows and
read its cross tensors, which stay at the image batch). `decode` accepts any beam size from 1
to `beam_size`: search row i * beam + j runs on graph row i * beam_size + j and the graph's
other rows are never read, so greedy decoding runs on the same graph as beam search.

Where the decoding state lives (edgecap.runtime.steppers): in host memory on onnxruntime's CPU
provider (`HostStepper`), in the GPU's memory on the CUDA / TensorRT providers and TensorRT
engines (`DeviceStepper`, which needs the bundle's `cache_update` graph), each chosen by
`Bundle.load(device_state=...)`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgecap.contract.beam import DecodeOptions, Hypotheses, beam_search
from edgecap.contract.manifest import DecodingDefaults, DecodingState, Manifest, load_manifest
from edgecap.contract.preprocess import Preprocessing
from edgecap.errors import EdgecapError

from .engines import OrtGraph, TrtGraph, engines_importable, say_once
from .steppers import CrossTensors, DeviceCross, DeviceStepper, HostStepper

ROLES = ("visual", "encoder", "decoder_step", "cache_update")


class Bundle:
    def __init__(self, path: Path, manifest: Manifest, graphs: dict, engine: str, device_state: bool = False):
        self.path = path
        self._steppers: dict[int, HostStepper | DeviceStepper] = {}
        self.manifest = manifest
        self._graphs = graphs
        self.engine = engine
        self.device_state = device_state
        self._cross: CrossTensors | None = None  # the device path's cross tensors, made on first use
        self.retriever = None
        if manifest.retrieval:  # RA-T: faiss-cpu retrieval feeds the encoder (no torch)
            from edgecap.retrieval.bundle import BundleRetriever

            self.retriever = BundleRetriever.load(path, manifest.retrieval)

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, providers: list[str] | None = None, engine: str = "auto",
             threads: int = 0, spin: bool = True, device_state: bool | None = None,
             cuda_graph: bool = False) -> Bundle:
        """Validate the manifest and every listed file, then open the graphs.

        threads / spin: onnxruntime's intra-op threads (0: one per physical core) and whether
        they busy-wait between ops (docs/runtime.md, "onnxruntime settings").

        engine: "auto" uses the bundle's TensorRT engines when it has them and the TensorRT that
        built them (tensorrt or tensorrt_rtx) can be imported (an engine this machine cannot run,
        for want of that release or a supported GPU, is refused in one line), otherwise
        onnxruntime; "onnxruntime" or "tensorrt" force one.

        device_state: where the decoding state lives (docs/runtime.md, "Where the decoding
        state lives"). None: on the device when the decoder step runs on a GPU (CUDA or
        TensorRT) and the bundle has its `cache_update` graph, else in host memory; True: on
        the device (on the CPU provider, onnxruntime tensors in host memory: the same code
        path, which is how it is tested without a GPU); False: in host memory (on a GPU every
        step then copies the cache to the device and back).

        cuda_graph: capture the decoder step and the cache update as CUDA graphs (one per
        ping-pong side and beam size) and replay them; needs the device path on a GPU.
        """
        root = Path(path)
        manifest = load_manifest(root)
        if engine not in ("auto", "onnxruntime", "tensorrt"):
            raise EdgecapError(f"engine {engine!r}, expected auto, onnxruntime or tensorrt")
        has_engines = any(g.engine == "tensorrt" for g in manifest.graphs)
        if engine == "tensorrt" and not has_engines:
            raise EdgecapError(f"bundle {root} has no TensorRT engines (export with --engine trt)")
        use_trt = engine == "tensorrt" or (engine == "auto" and has_engines and engines_importable(manifest))
        graphs = {}
        for role in ROLES:
            captured = cuda_graph and role in ("decoder_step", "cache_update")
            trt_entry = manifest.graph(role, "tensorrt") if use_trt else None
            if trt_entry is not None:
                graphs[role] = TrtGraph(root / trt_entry.file, trt_entry, root, cuda_graph=captured)
                continue
            entry = manifest.graph(role)
            if entry is not None:
                graphs[role] = OrtGraph(root / entry.file, entry, providers, threads=threads, spin=spin,
                                        cuda_graph=captured)
        device_state = _where_state_lives(root, graphs, device_state, cuda_graph)
        return cls(root, manifest, graphs, "tensorrt" if use_trt else "onnxruntime", device_state)

    # -- what the bundle is ------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.manifest.batch_size

    @property
    def beam_size(self) -> int:
        return self.manifest.beam_size

    @property
    def max_len(self) -> int:
        return self.manifest.max_len

    @property
    def itos(self) -> list[str]:
        return self.manifest.vocab.itos

    @property
    def bos_id(self) -> int:
        return self.manifest.vocab.bos_id

    @property
    def eos_id(self) -> int:
        return self.manifest.vocab.eos_id

    @property
    def pad_id(self) -> int:
        return self.manifest.vocab.pad_id

    @property
    def has_visual(self) -> bool:
        return "visual" in self._graphs

    @property
    def preprocessing(self) -> Preprocessing | None:
        """How camera frames are prepared for the visual graph (None: the bundle reads features)."""
        return self.manifest.preprocessing

    @property
    def decoding(self) -> DecodingDefaults:
        """The export's default beam size, caption length and length penalty."""
        return self.manifest.decoding

    @property
    def state(self) -> DecodingState:
        """The decoding state's description: cache and cross tensors, TopK width, cache update."""
        return self.manifest.state

    @property
    def providers(self) -> list[str]:
        graph = self._graphs["encoder"]
        return graph.providers if isinstance(graph, OrtGraph) else ["TensorRT"]

    # -- running -----------------------------------------------------------------------------
    def visual(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """float32 [batch, 3, H, W] (already preprocessed) -> (features, mask)."""
        if not self.has_visual:
            raise EdgecapError(f"bundle {self.path} reads precomputed features: it has no visual graph")
        graph = self._graphs["visual"]
        feats, mask = graph.run({graph.entry.inputs[0].name: images})
        return feats, mask

    @property
    def encode_extra_names(self) -> list[str]:
        """Inputs `encode` takes after (feats, mask), e.g. RA-T's retrieved caption tokens."""
        return list(self.manifest.state.encode_extra_names)

    def _encoder_feeds(self, feats: np.ndarray, mask: np.ndarray, extra: tuple) -> dict[str, np.ndarray]:
        """With a retriever in the bundle and no extras given, retrieval supplies them."""
        if not extra and self.retriever is not None:
            extra = (self.retriever(feats, mask),)
        names = ["features", "mask", *self.encode_extra_names]
        if len(extra) != len(names) - 2:
            raise EdgecapError(
                f"bundle {self.path}: encode takes features, mask and {len(names) - 2} extra input(s) "
                f"({', '.join(names[2:]) or 'none'}), got {len(extra)}"
            )
        return dict(zip(names, (feats, mask, *extra), strict=False))

    def encode(self, feats: np.ndarray, mask: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]:
        """-> the cross tensors as numpy arrays, in the state description's order."""
        return tuple(self._graphs["encoder"].run(self._encoder_feeds(feats, mask, extra)))

    def encode_for_decoding(self, feats: np.ndarray, mask: np.ndarray, *extra: np.ndarray):
        """The cross tensors where `decode` reads them: on the device path written by the
        encoder straight into the decoder's device tensors (a `DeviceCross`, valid until the
        next encode), else `encode`'s numpy arrays."""
        encoder = self._graphs["encoder"]
        if not self.device_state or type(encoder) is not type(self._graphs["decoder_step"]) \
                or encoder.memory != self._graphs["decoder_step"].memory:
            return self.encode(feats, mask, *extra)
        cross = self._cross_tensors()
        encoder.run_into(self._encoder_feeds(feats, mask, extra), cross.tensors)
        return cross.handle()

    def _cross_tensors(self) -> CrossTensors:
        if self._cross is None:
            self._cross = CrossTensors(self._graphs["decoder_step"], self.manifest.state.cross_graph_names)
        return self._cross

    def stepper(self, cross: tuple[np.ndarray, ...] | DeviceCross, beam: int | None = None):
        """A Stepper over batch * beam rows (default: all batch * beam_size rows), its state
        where `device_state` says."""
        beam = self.beam_size if beam is None else beam
        if self.device_state:
            return DeviceStepper(self, self._cross_tensors(), beam).reset(cross)
        return HostStepper(self, cross, beam)

    def decode(self, cross: tuple[np.ndarray, ...] | DeviceCross, options: DecodeOptions | None = None) -> Hypotheses:
        options = options or DecodeOptions(beam_size=self.beam_size, max_len=self.max_len,
                                           length_penalty=self.manifest.decoding.length_penalty)
        if not 1 <= options.beam_size <= self.beam_size:
            raise EdgecapError(
                f"beam_size={options.beam_size}: this bundle's decoder graph has {self.beam_size} rows per "
                f"image, so beams 1..{self.beam_size} (export with a larger --beam)"
            )
        if options.max_len > self.max_len:
            raise EdgecapError(f"max_len={options.max_len} exceeds the bundle's static cache length {self.max_len}")
        # One stepper per beam size, reused across frames: its cache and feeds are allocated once.
        stepper = self._steppers.get(options.beam_size)
        if stepper is None:
            stepper = self._steppers[options.beam_size] = self.stepper(cross, options.beam_size)
        else:
            stepper.reset(cross)
        return beam_search(stepper, self.batch_size, options, self.bos_id, self.eos_id, self.pad_id)

    def captions(self, hyp: Hypotheses) -> list[str]:
        """The best hypothesis of each image as text (specials dropped, up to EOS)."""
        return [" ".join(self.manifest.vocab.decode(row)) for row in np.asarray(hyp.tokens)[:, 0]]


def _where_state_lives(root: Path, graphs: dict, asked: bool | None, cuda_graph: bool) -> bool:
    """Whether the decoding state lives on the device (see `Bundle.load`); a request that
    cannot be met is a one-line error."""
    step, update = graphs["decoder_step"], graphs.get("cache_update")
    together = update is not None and type(update) is type(step) and update.memory == step.memory
    on_gpu = step.memory == "cuda"
    if asked is None:
        asked = on_gpu and together
        if on_gpu and update is None:
            say_once(f"bundle {root} has no cache_update graph, so its decoding state is copied between host and "
                     f"GPU every step: re-export it with this edgecap version to keep it on the GPU")
    if asked and not together:
        why = ("it has no cache_update graph (re-export it with this edgecap version)" if update is None else
               "its decoder step and cache_update graph do not run in the same memory")
        raise EdgecapError(f"bundle {root}: the decoding state cannot stay on the device: {why}")
    if asked and step.memory is None:
        raise EdgecapError(f"bundle {root}: the decoding state cannot stay on the device: edgecap holds no "
                           f"tensors for {step.providers[0]}")
    if cuda_graph and not (asked and on_gpu):
        raise EdgecapError(f"bundle {root}: CUDA graphs need the decoding state on a GPU "
                           f"(device_state and the CUDA or TensorRT provider, or TensorRT engines)")
    return bool(asked)

