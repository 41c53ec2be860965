"""`Bundle`: a loaded export bundle, torch-free (numpy, onnxruntime; TensorRT when present).

    bundle = Bundle.load("bundle/")
    feats, mask = bundle.visual(images)            # float32 [batch, 3, H, W]
    cross = bundle.encode(feats, mask)
    hyp = bundle.decode(cross, DecodeOptions(beam_size=3, max_len=bundle.max_len))
    bundle.captions(hyp)

Every graph has a static batch: the visual and encoder graphs take exactly `batch_size` images,
the decoder step `batch_size * beam_size` rows (the beams of an image are consecutive rows and
read its cross tensors, which stay at the image batch). `decode` accepts any beam size from 1
to `beam_size`: search row i * beam + j runs on graph row i * beam_size + j and the graph's
other rows are never read, so greedy decoding runs on the same graph as beam search.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgecap.contract.beam import DecodeOptions, Hypotheses, beam_search, row_top_k
from edgecap.contract.manifest import Manifest, load_manifest
from edgecap.contract.state import CACHE_OUT_SUFFIX
from edgecap.errors import EdgecapError

from .engines import OrtGraph, TrtGraph, engines_importable


class _CacheGroup:
    """Cache tensors of one shape, dtype and slot axis (e.g. every layer's keys), stacked in one
    array whose slices the graph reads and writes, so writing a step's new slots and reordering
    beams are one numpy call for the whole group."""

    def __init__(self, shape, new_shape, dtype, axis, batch_axis: int, count: int):
        self.cache = np.zeros((count, *shape), dtype)
        self.new = np.zeros((count, *new_shape), dtype)
        self.axis = axis  # of the T slots in one tensor; None: the output is the whole tensor
        self.batch_axis = batch_axis

    def _slots(self, stop: int, start: int = 0):
        return self.cache[(slice(None),) * (self.axis + 1) + (slice(start, stop),)]

    def write(self, t: int) -> None:
        np.copyto(self.cache if self.axis is None else self._slots(t + 1, t), self.new)

    def move(self, src: np.ndarray, dst: np.ndarray, filled: int) -> None:
        part = self.cache if self.axis is None else self._slots(filled)
        view = np.moveaxis(part, self.batch_axis + 1, 1)
        view[:, dst] = view[:, src]  # the right side is gathered first, so rows may swap


class BundleStepper:
    """The decoder-step graph as a `Stepper` for contract.beam, running `beam` of the graph's
    beam_size rows per image.

    Every buffer is allocated and bound to the graph once: token, step, the cache (read by the
    graph where it lies), the cross tensors and the outputs (log-probs, the top-K tokens of every
    row, each cache tensor's new slot). A step writes the new slots into slot t of the cache;
    `reorder` moves, for the rows whose beam changed, only the t + 1 filled slots. Nothing the
    size of the cache or the vocabulary is allocated or copied per step.
    """

    def __init__(self, bundle: Bundle, cross: tuple[np.ndarray, ...], beam: int):
        state = bundle.manifest.state
        graph = bundle._graphs["decoder_step"]
        entry = graph.entry
        images, per_image = bundle.batch_size, bundle.beam_size
        # search row i * beam + j -> graph row i * beam_size + j
        self.rows = (np.arange(images)[:, None] * per_image + np.arange(beam)[None, :]).reshape(-1)
        self.identity = beam == per_image
        ins, outs = {t.name: t for t in entry.inputs}, {t.name: t for t in entry.outputs}
        self.token = np.zeros(images * per_image, np.int64)
        self.step = np.zeros((), np.int64)
        # the exporter drops inputs a graph never reads (an LSTM's step); those get no buffer
        self.cross_names = state.cross_graph_names
        self.cross = {n: np.zeros(ins[n].shape, np.dtype(ins[n].dtype)) for n in self.cross_names if n in ins}
        bound: dict[str, np.ndarray] = {}
        members: dict[tuple, list[tuple[str, str]]] = {}
        for tensor in state.graph_tensors("cache"):
            name, out = tensor.name, tensor.name + CACHE_OUT_SUFFIX
            if name in ins:
                key = (tuple(ins[name].shape), tuple(outs[out].shape), ins[name].dtype, tensor.slot_axis, tensor.batch_axis)
                members.setdefault(key, []).append((name, out))
        self.groups = []
        for (shape, new_shape, dtype, axis, batch_axis), names in members.items():
            group = _CacheGroup(shape, new_shape, np.dtype(dtype), axis, batch_axis, len(names))
            for i, (name, out) in enumerate(names):
                bound[name], bound[out] = group.cache[i], group.new[i]
            self.groups.append(group)
        self.outputs = [bound[t.name] if t.name in bound else np.zeros(t.shape, np.dtype(t.dtype)) for t in entry.outputs]
        out = dict(zip(outs, self.outputs, strict=True))
        self.logprobs = out["logprobs"]
        self.top = (out["top_logprobs"], out["top_tokens"]) if state.top_k else None
        inputs = {"token": self.token, "step": self.step, **self.cross, **{n: bound[n] for n in ins if n in bound}}
        self.run = graph.bind(inputs, self.outputs)
        self.filled = 0
        self.reset(cross)

    def reset(self, cross: tuple[np.ndarray, ...]) -> BundleStepper:
        """Start a new batch of images in the same buffers (no allocation per frame)."""
        for name, value in zip(self.cross_names, cross, strict=True):
            if name in self.cross:
                np.copyto(self.cross[name], value)
        for group in self.groups:
            group.cache.fill(0)
        self.filled = 0
        return self

    def _run(self, tokens: np.ndarray, t: int) -> None:
        self.token[self.rows] = tokens
        self.step[...] = t
        self.run()
        for group in self.groups:
            group.write(t)
        self.filled = t + 1

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        self._run(tokens, t)
        return self.logprobs if self.identity else self.logprobs[self.rows]

    def top_k(self, tokens: np.ndarray, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        if self.top is None:
            return row_top_k(self(tokens, t), k)
        self._run(tokens, t)
        values, ids = self.top
        return values[self.rows, :k], ids[self.rows, :k]

    def reorder(self, rows: np.ndarray) -> None:
        src, dst = self.rows[rows], self.rows
        moved = src != dst
        if not moved.any():
            return
        for group in self.groups:
            group.move(src[moved], dst[moved], self.filled)


class Bundle:
    def __init__(self, path: Path, manifest: Manifest, graphs: dict, engine: str):
        self.path = path
        self._steppers: dict[int, BundleStepper] = {}
        self.manifest = manifest
        self._graphs = graphs
        self.engine = engine
        self.retriever = None
        if manifest.retrieval:  # RA-T: faiss-cpu retrieval feeds the encoder (no torch)
            from edgecap.retrieval.bundle import BundleRetriever

            self.retriever = BundleRetriever.load(path, manifest.retrieval)

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, providers: list[str] | None = None, engine: str = "auto",
             threads: int = 0, spin: bool = True) -> Bundle:
        """Validate the manifest and every listed file, then open the graphs.

        threads / spin: onnxruntime's intra-op threads (0: one per physical core) and whether
        they busy-wait between ops (docs/runtime.md, "onnxruntime settings").

        engine: "auto" uses the bundle's TensorRT engines when it has them and the TensorRT that
        built them (tensorrt or tensorrt_rtx) can be imported (an engine this machine cannot run,
        for want of that release or a supported GPU, is refused in one line), otherwise
        onnxruntime; "onnxruntime" or "tensorrt" force one.
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
        for role in ("visual", "encoder", "decoder_step"):
            trt_entry = manifest.graph(role, "tensorrt") if use_trt else None
            if trt_entry is not None:
                graphs[role] = TrtGraph(root / trt_entry.file, trt_entry, root)
                continue
            entry = manifest.graph(role)
            if entry is not None:
                graphs[role] = OrtGraph(root / entry.file, entry, providers, threads=threads, spin=spin)
        return cls(root, manifest, graphs, "tensorrt" if use_trt else "onnxruntime")

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
    def preprocessing(self) -> dict:
        pre = self.manifest.preprocessing
        return {} if pre is None else pre.to_dict()

    @property
    def decoding(self) -> dict:
        d = self.manifest.decoding
        return {"beam_size": d.beam_size, "max_len": d.max_len, "length_penalty": d.length_penalty}

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

    def encode(self, feats: np.ndarray, mask: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]:
        """With a retriever in the bundle and no extras given, retrieval supplies them."""
        if not extra and self.retriever is not None:
            extra = (self.retriever(feats, mask),)
        names = ["features", "mask", *self.encode_extra_names]
        if len(extra) != len(names) - 2:
            raise EdgecapError(
                f"bundle {self.path}: encode takes features, mask and {len(names) - 2} extra input(s) "
                f"({', '.join(names[2:]) or 'none'}), got {len(extra)}"
            )
        return tuple(self._graphs["encoder"].run(dict(zip(names, (feats, mask, *extra), strict=False))))

    def stepper(self, cross: tuple[np.ndarray, ...], beam: int | None = None) -> BundleStepper:
        """A Stepper over batch * beam rows (default: all batch * beam_size rows)."""
        return BundleStepper(self, cross, self.beam_size if beam is None else beam)

    def decode(self, cross: tuple[np.ndarray, ...], options: DecodeOptions | None = None) -> Hypotheses:
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
