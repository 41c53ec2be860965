"""`Bundle`: a loaded export bundle, torch-free (numpy, onnxruntime; TensorRT when present).

    bundle = Bundle.load("bundle/")
    feats, mask = bundle.visual(images)            # float32 [batch, 3, H, W]
    cross = bundle.encode(feats, mask)
    hyp = bundle.decode(cross, DecodeOptions(beam_size=3, max_len=bundle.max_len))
    bundle.captions(hyp)

Every graph has a static batch: the visual and encoder graphs take exactly `batch_size` images,
the decoder step `batch_size * beam_size` rows (beams are batch rows). `decode` accepts any beam
size from 1 to `beam_size`: each image's cross rows are repeated `beam` times and the rows the
search does not use are filled with copies of the last image's rows and ignored, so greedy
decoding runs on the same graph as beam search.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from edgecap.contract.beam import DecodeOptions, Hypotheses, beam_search
from edgecap.errors import EdgecapError, require

from .engines import OrtGraph, TrtGraph
from .manifest import Manifest, load_manifest


class BundleStepper:
    """The decoder-step graph as a `Stepper` for contract.beam, over `used` of its R rows.

    The cache is two preallocated buffer sets: each step reads one and the graph writes the
    other (onnxruntime binds them in place on CPU); reorder gathers rows along the cache's batch
    axis into the idle set. Nothing is allocated per step except the row-index arrays.
    """

    def __init__(self, bundle: Bundle, cross: tuple[np.ndarray, ...], repeats: int):
        m = bundle.manifest
        self.graph = bundle._graphs["decoder_step"]
        entry = self.graph.entry
        self.rows = bundle.batch_size * bundle.beam_size
        self.used = bundle.batch_size * repeats
        self.axis = m.state.cache_batch_axis
        self.cache_names = list(m.state.cache_names)
        out_specs = {t.name: t for t in entry.outputs}
        logp_spec = entry.outputs[0]
        self.logprobs = np.zeros(logp_spec.shape, np.dtype(logp_spec.dtype))
        self.cache = [np.zeros(out_specs[n].shape, np.dtype(out_specs[n].dtype)) for n in m.state.cache_outputs]
        self.spare = [np.zeros_like(c) for c in self.cache]
        self.bundle = bundle
        self.cross_buffers = bundle._expand(cross, repeats)
        self.feeds = dict(zip(m.state.cross_names, self.cross_buffers, strict=False))
        self.token = np.zeros(self.rows, np.int64)
        self.step = np.zeros((), np.int64)
        # token, step and the cross buffers are updated in place; only the cache entries
        # change identity (read set / write set swap), so one feed dict serves every step
        self.feeds.update(token=self.token, step=self.step)
        self.all_rows = np.arange(self.rows, dtype=np.int64)

    def reset(self, cross: tuple[np.ndarray, ...]) -> BundleStepper:
        """Start a new batch of images in the same buffers (no allocation per frame)."""
        self.bundle._expand(cross, self.used // self.bundle.batch_size, out=self.cross_buffers)
        for buffer in self.cache:
            buffer.fill(0)
        return self

    def __call__(self, tokens: np.ndarray, t: int) -> np.ndarray:
        self.token[: self.used] = tokens
        self.token[self.used :] = tokens[-1] if self.used else 0
        self.step[...] = t
        self.feeds.update(zip(self.cache_names, self.cache, strict=False))
        self.graph.run_into(self.feeds, [self.logprobs, *self.spare])
        self.cache, self.spare = self.spare, self.cache
        return self.logprobs[: self.used]

    def reorder(self, rows: np.ndarray) -> None:
        full = self.all_rows.copy()
        full[: self.used] = rows
        for src, dst in zip(self.cache, self.spare, strict=False):
            np.take(src, full, axis=self.axis, out=dst)
        self.cache, self.spare = self.spare, self.cache


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
             threads: int = 0) -> Bundle:
        """Validate the manifest and every listed file, then open the graphs.

        engine: "auto" uses the bundle's TensorRT engines when it has them and `tensorrt` can
        be imported (an engine built elsewhere is refused, saying how to rebuild), otherwise
        onnxruntime; "onnxruntime" or "tensorrt" force one.
        """
        root = Path(path)
        manifest = load_manifest(root)
        if engine not in ("auto", "onnxruntime", "tensorrt"):
            raise EdgecapError(f"engine {engine!r}, expected auto, onnxruntime or tensorrt")
        has_engines = any(g.engine == "tensorrt" for g in manifest.graphs)
        if engine == "tensorrt" and not has_engines:
            raise EdgecapError(f"bundle {root} has no TensorRT engines (export with --engine trt)")
        use_trt = engine == "tensorrt" or (engine == "auto" and has_engines and _importable("tensorrt"))
        if use_trt:
            require("tensorrt", "trt", "native TensorRT engines")
        graphs = {}
        for role in ("visual", "encoder", "decoder_step"):
            trt_entry = manifest.graph(role, "tensorrt") if use_trt else None
            if trt_entry is not None:
                graphs[role] = TrtGraph(root / trt_entry.file, trt_entry, root)
                continue
            entry = manifest.graph(role)
            if entry is not None:
                graphs[role] = OrtGraph(root / entry.file, entry, providers, threads=threads)
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
        return {} if pre is None else {
            "size": pre.size, "resize": pre.resize, "mean": list(pre.mean), "std": list(pre.std),
            "channel_order": pre.channel_order, "crop": pre.crop, "resize_size": pre.resize_size,
        }

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

    def _expand(self, cross, repeats: int, out: list[np.ndarray] | None = None) -> list[np.ndarray]:
        """Each image's rows `repeats` times along its batch axis, padded to the graph's rows
        with copies of the last one; written into `out` when given."""
        rows = self.batch_size * self.beam_size
        result = []
        for i, (value, axis) in enumerate(zip(cross, self.manifest.state.cross_batch_axes, strict=False)):
            value = np.asarray(value)
            index = np.repeat(np.arange(value.shape[axis]), repeats)
            index = np.concatenate([index, np.full(rows - index.size, index[-1])])
            if out is None:
                result.append(np.ascontiguousarray(np.take(value, index, axis=axis)))
            else:
                np.take(value, index, axis=axis, out=out[i])
                result.append(out[i])
        return result

    def stepper(self, cross: tuple[np.ndarray, ...], repeats: int | None = None) -> BundleStepper:
        """A Stepper over batch * repeats rows (default: all batch * beam_size rows)."""
        return BundleStepper(self, cross, self.beam_size if repeats is None else repeats)

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
        special = {self.pad_id, self.bos_id}
        out = []
        for row in np.asarray(hyp.tokens)[:, 0]:
            words = []
            for token in row:
                token = int(token)
                if token == self.eos_id:
                    break
                if token not in special:
                    words.append(self.itos[token])
            out.append(" ".join(words))
        return out


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
