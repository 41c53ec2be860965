"""Retrieval inside a bundle: what export writes and what the torch-free runtime reads.

    bundle/retrieval/index.faiss         the training-set index (inner product, unit vectors)
    bundle/retrieval/memory_tokens.npy   int64 [n_indexed, length]: each indexed image's first
                                         caption, encoded with the model's vocabulary

The manifest's `retrieval` section lists both files with their sha256 (checked on load like
the graphs), k, length, the pad id and where the embeddings came from. At run time the
retriever embeds the visual features (mean of the grid, L2-normalised: the same function the
index was built with), searches k neighbours and gathers their caption tokens: the encoder
graph's `memory_tokens` input. No vocabulary or tokenizer is needed on the robot.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgecap.contract.manifest import RetrievalAssets
from edgecap.errors import EdgecapError
from edgecap.retrieval.embedding import image_embeddings
from edgecap.retrieval.index import EF_SEARCH, CaptionIndex, _faiss, write_faiss
from edgecap.retrieval.memory import memory_tokens

FOLDER = "retrieval"
INDEX_FILE = f"{FOLDER}/index.faiss"
TOKENS_FILE = f"{FOLDER}/memory_tokens.npy"


def write_assets(index: CaptionIndex, table: np.ndarray, root: str | Path, k: int, length: int,
                 pad_id: int) -> dict:
    """Write the index and token table under `root`; -> the manifest's `retrieval` section
    (without sha256s, which the exporter adds with the rest)."""
    root = Path(root)
    (root / FOLDER).mkdir(parents=True, exist_ok=True)
    if table.shape != (len(index), length):
        raise EdgecapError(f"retrieval token table has shape {table.shape}, expected ({len(index)}, {length})")
    write_faiss(index.index, root / INDEX_FILE)
    np.save(root / TOKENS_FILE, np.ascontiguousarray(table, dtype=np.int64))
    return {"index": INDEX_FILE, "tokens": TOKENS_FILE, "kind": index.meta["kind"], "count": len(index),
            "dim": index.dim, "k": int(k), "length": int(length), "pad_id": int(pad_id),
            "embedding": index.meta.get("embedding", {})}


class BundleRetriever:
    """features [B, N, D] + mask -> memory tokens [B, k, length] int64 (torch-free)."""

    def __init__(self, index, table: np.ndarray, k: int, pad_id: int):
        self.index, self.table, self.k, self.pad_id = index, table, k, pad_id
        self.last_ms = 0.0  # time of the latest retrieval (embedding + search + gather)

    @classmethod
    def load(cls, root: str | Path, assets: RetrievalAssets) -> BundleRetriever:
        """The retriever of the bundle at `root`, from the files its manifest lists."""
        faiss = _faiss()
        root = Path(root)
        index = faiss.read_index(str(root / assets.index))
        if assets.kind == "hnsw":
            index.hnsw.efSearch = EF_SEARCH
        table = np.load(root / assets.tokens)
        if index.ntotal != table.shape[0] or table.shape[1:] != (assets.length,) or index.d != assets.dim:
            raise EdgecapError(
                f"bundle {root}: retrieval index ({index.ntotal} x {index.d}) and token table {table.shape} "
                f"do not match the manifest (count {assets.count}, dim {assets.dim}, length {assets.length})"
            )
        return cls(index, table, assets.k, assets.pad_id)

    def __call__(self, feats: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        start = time.perf_counter()
        emb = image_embeddings(feats, mask)
        if emb.shape[1] != self.index.d:
            raise EdgecapError(f"retrieval: features have {emb.shape[1]} dimensions, the index has {self.index.d}")
        _, rows = self.index.search(emb, min(self.k, self.index.ntotal))
        if rows.shape[1] < self.k:
            rows = np.pad(rows, ((0, 0), (0, self.k - rows.shape[1])), constant_values=-1)
        out = memory_tokens(rows, self.table, self.pad_id)
        self.last_ms = (time.perf_counter() - start) * 1e3
        return out
