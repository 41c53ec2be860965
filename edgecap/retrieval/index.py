"""A FAISS index of training-image embeddings with the caption table beside it.

Inner product on L2-normalised embeddings (cosine similarity). HNSW with 32 links per node
for large sets; an exact flat index below `FLAT_BELOW` images, where exact search is as fast
and leaves nothing to tune. Each indexed image is one row; `captions.json` holds its image id
and reference captions, and `neighbours.npy` its k nearest *other* indexed images, computed at
build time so training reads its retrieval memory without querying (its own captions are
never among them).

Directory layout (written atomically):
    index.json      format, kind, links, dim, count, k, build time, what made the embeddings
    index.faiss     the FAISS index
    captions.json   {"image_ids": [...], "captions": [[caption, ...], ...]}
    neighbours.npy  int64 [count, k], -1 where fewer than k other images exist
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require
from edgecap.io import RETRIEVAL_INDEX, atomic_dir
from edgecap.jsonio import read_json

FORMAT = "edgecap-retrieval-index"
FORMAT_VERSION = 1
FLAT_BELOW = 5_000
HNSW_LINKS = 32
EF_CONSTRUCTION = 80
EF_SEARCH = 64
KINDS = ("auto", "flat", "hnsw")
FILES = ("index.json", "index.faiss", "captions.json", "neighbours.npy")


def _faiss():
    return require("faiss", "retrieval", "kNN caption retrieval")


def write_faiss(index, path: str | os.PathLike) -> None:
    """faiss.write_index, but through Python's file writes: faiss reports a full disk as a
    RuntimeError ("write error in ... (No space left on device)"), Python as the OSError that
    edgecap's writers turn into one line naming the output and the free space. The serialized
    index is held in memory once more while it is written (caption indexes are small)."""
    data = _faiss().serialize_index(index)
    with open(path, "wb") as fh:
        fh.write(memoryview(data))


def _check_embeddings(emb, what: str) -> np.ndarray:
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] == 0:
        raise EdgecapError(f"{what}: embeddings have shape {emb.shape}, expected [n > 0, D]")
    if not np.isfinite(emb).all():
        raise EdgecapError(f"{what}: embeddings contain NaN or inf")
    return emb


class CaptionIndex:
    def __init__(self, index, image_ids: list[str], captions: list[list[str]],
                 neighbours: np.ndarray, meta: dict):
        self.index = index
        self.image_ids = [str(i) for i in image_ids]
        self.captions = captions
        self.neighbours = neighbours
        self.meta = meta
        self._row_of = {image_id: row for row, image_id in enumerate(self.image_ids)}

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @classmethod
    def build(cls, embeddings, image_ids, captions, kind: str = "auto", k: int = 10,
              links: int = HNSW_LINKS, embedding_info: dict | None = None) -> CaptionIndex:
        """Index `embeddings` [n, D] (unit norm) of images `image_ids` with their captions."""
        faiss = _faiss()
        emb = _check_embeddings(embeddings, "retrieval index")
        n, dim = emb.shape
        if len(image_ids) != n or len(captions) != n:
            raise EdgecapError(
                f"retrieval index: {n} embeddings but {len(image_ids)} image ids and {len(captions)} caption lists"
            )
        if len(set(map(str, image_ids))) != n:
            raise EdgecapError("retrieval index: image ids are not unique")
        if kind not in KINDS:
            raise EdgecapError(f"retrieval index kind {kind!r}, expected one of {', '.join(KINDS)}")
        if k < 1:
            raise EdgecapError(f"retrieval k={k}, expected >= 1")
        if kind == "auto":
            kind = "flat" if n < FLAT_BELOW else "hnsw"
        start = time.perf_counter()
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        else:
            index = faiss.IndexHNSWFlat(dim, links, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = EF_CONSTRUCTION
            index.hnsw.efSearch = EF_SEARCH
        index.add(emb)
        build_seconds = time.perf_counter() - start
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "kind": kind,
            "links": links if kind == "hnsw" else None,
            "metric": "inner_product",
            "dim": int(dim),
            "count": int(n),
            "k": int(k),
            "build_seconds": round(build_seconds, 6),
            "embedding": dict(embedding_info or {}),
        }
        self = cls(index, [str(i) for i in image_ids], [list(map(str, c)) for c in captions],
                   np.empty((n, 0), dtype=np.int64), meta)
        start = time.perf_counter()
        self.neighbours, _ = self.search(emb, k, exclude_ids=self.image_ids)
        meta["neighbour_seconds"] = round(time.perf_counter() - start, 6)
        return self

    def search(self, queries, k: int, exclude_ids=None) -> tuple[np.ndarray, np.ndarray]:
        """queries [Q, D] -> (rows [Q, k] int64, scores [Q, k] float32), best first.

        exclude_ids: one image id per query (or None) whose own row is skipped; -1 / -inf pad
        the result when the index holds fewer than k other images."""
        queries = _check_embeddings(queries, "retrieval query")
        if queries.shape[1] != self.dim:
            raise EdgecapError(f"retrieval query has {queries.shape[1]} dimensions, the index has {self.dim}")
        if exclude_ids is not None and len(exclude_ids) != len(queries):
            raise EdgecapError(f"retrieval: {len(exclude_ids)} exclude ids for {len(queries)} queries")
        wanted = k + (exclude_ids is not None)
        scores, found = self.index.search(queries, min(wanted, len(self)))
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        for q in range(len(queries)):
            skip = self._row_of.get(str(exclude_ids[q])) if exclude_ids is not None else None
            keep = [(r, s) for r, s in zip(found[q], scores[q], strict=True) if r >= 0 and r != skip][:k]
            for j, (r, s) in enumerate(keep):
                rows[q, j], out_scores[q, j] = r, s
        return rows, out_scores

    def rows_of(self, image_ids) -> np.ndarray:
        """Table rows of indexed images; an id not in the index is an error naming it."""
        missing = [i for i in image_ids if str(i) not in self._row_of]
        if missing:
            raise EdgecapError(f"retrieval index has no image {missing[0]!r} ({len(missing)} missing)")
        return np.array([self._row_of[str(i)] for i in image_ids], dtype=np.int64)

    def save(self, out: str | os.PathLike, force: bool = False) -> Path:
        out = Path(out)
        with atomic_dir(out, RETRIEVAL_INDEX, force=force) as tmp:
            write_faiss(self.index, tmp / "index.faiss")
            (tmp / "captions.json").write_text(
                json.dumps({"image_ids": self.image_ids, "captions": self.captions}), encoding="utf-8"
            )
            np.save(tmp / "neighbours.npy", self.neighbours)
            (tmp / "index.json").write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
        return out

    @classmethod
    def load(cls, path: str | os.PathLike) -> CaptionIndex:
        faiss = _faiss()
        path = Path(path)
        if not path.is_dir():
            raise EdgecapError(f"retrieval index {path} is not a directory (build one with edgecap index build)")
        for name in FILES:
            if not (path / name).is_file():
                raise EdgecapError(f"retrieval index {path} lacks {name}")
        meta, table = (read_json(path / name, where=f"retrieval index {path / name}")
                       for name in ("index.json", "captions.json"))
        if not isinstance(meta, dict) or not isinstance(table, dict):
            raise EdgecapError(f"retrieval index {path}: index.json and captions.json must hold JSON objects; rebuild it")
        if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
            raise EdgecapError(
                f"retrieval index {path}: format {meta.get('format')!r} v{meta.get('format_version')!r}, "
                f"expected {FORMAT!r} v{FORMAT_VERSION}"
            )
        index = faiss.read_index(str(path / "index.faiss"))
        if meta["kind"] == "hnsw":
            index.hnsw.efSearch = EF_SEARCH
        image_ids, captions = table.get("image_ids"), table.get("captions")
        neighbours = np.load(path / "neighbours.npy")
        n = index.ntotal
        if not (isinstance(image_ids, list) and isinstance(captions, list)) or len(image_ids) != n \
                or len(captions) != n or neighbours.shape[0] != n or meta.get("dim") != index.d:
            raise EdgecapError(
                f"retrieval index {path}: index.faiss has {n} vectors of {index.d} dims but the caption "
                f"table, neighbours.npy or index.json disagree; rebuild it"
            )
        return cls(index, image_ids, captions, neighbours, meta)
