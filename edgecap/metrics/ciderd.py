"""CIDEr-D in numpy/scipy, numerically matching pycocoevalcap's `Cider` scorer.

Definition (Vedantam et al. 2015, the "-D" variant used by the COCO server and SCST):
for n = 1..4, each sentence is a vector of n-gram weights tf * idf, with
idf(g) = log(N) - log(max(1, df(g))), N the number of images of the reference corpus and
df(g) the number of those images with g in any of their references. Against each reference r:

    sim_n = sum_g min(c_g, r_g) * r_g / (|c_n| |r_n|)        (clipped cosine)
    pen   = exp(-(len_c - len_r)^2 / (2 * sigma^2)),  sigma = 6
    CIDEr-D(c, R) = 10 / |R| * sum_r mean_n(sim_n) * pen

"len" is the sentence's bigram count, as in the reference code (it sums the term frequencies
of the n = 2 vectors). Sentences are whitespace-tokenised strings: tokenise them the same way
as the corpus (PTB tokenizer for COCO evaluation, the training vocabulary for SCST).

The corpus statistics are computed once (and can be cached on disk); the tf-idf vectors of
every reference list are cached, so scoring many candidate batches against the same
references (the SCST reward) costs one sparse min/multiply per batch.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.io import atomic_path


def ngram_counts(sentence: str, n: int = 4) -> Counter:
    words = sentence.split()
    counts: Counter = Counter()
    for k in range(1, n + 1):
        counts.update(zip(*(words[i:] for i in range(k)), strict=False))
    return counts


def corpus_fingerprint(refs_corpus: list[list[str]], n: int) -> str:
    h = hashlib.sha1(f"n={n}\n".encode())
    for refs in refs_corpus:
        h.update("\x1e".join(refs).encode("utf-8", "replace"))
        h.update(b"\x1d")
    return h.hexdigest()


class CiderD:
    """CIDEr-D scorer with document frequencies from `refs_corpus` (one reference list per image).

    To reproduce pycocoevalcap's `Cider`, pass the references being scored as the corpus.
    For SCST, pass the training set's references once and call `score` every batch.
    """

    def __init__(self, refs_corpus: list[list[str]], n: int = 4, sigma: float = 6.0,
                 cache_path: str | Path | None = None):
        if not refs_corpus:
            raise EdgecapError("CIDEr-D needs a non-empty reference corpus")
        self.n = n
        self.sigma = float(sigma)
        self.n_images = len(refs_corpus)
        self.log_n = math.log(float(self.n_images))
        self._ids: dict[tuple, int] = {}
        self._order: list[int] = []      # n - 1 of each n-gram id
        self._df: list[float] = []
        self._ref_cache: dict[tuple, tuple] = {}
        fingerprint = corpus_fingerprint(refs_corpus, n) if cache_path else None
        if cache_path and self._load_df(Path(cache_path), fingerprint):
            return
        df: Counter = Counter()
        for refs in refs_corpus:
            seen = set()
            for ref in refs:
                seen.update(ngram_counts(ref, n))
            df.update(seen)
        for gram, count in df.items():
            self._add(gram, float(count))
        if cache_path:
            self._save_df(Path(cache_path), fingerprint)

    # -- corpus statistics ---------------------------------------------------------------
    def _add(self, gram: tuple, df: float = 0.0) -> int:
        idx = self._ids.get(gram)
        if idx is None:
            idx = self._ids[gram] = len(self._order)
            self._order.append(len(gram) - 1)
            self._df.append(df)
            self._idf = None
        return idx

    def _idf_array(self) -> np.ndarray:
        if getattr(self, "_idf", None) is None or len(self._idf) != len(self._df):
            df = np.asarray(self._df, dtype=np.float64)
            self._idf = self.log_n - np.log(np.maximum(1.0, df))
        return self._idf

    def _save_df(self, path: Path, fingerprint: str) -> None:
        grams = "\n".join(" ".join(g) for g in self._ids).encode("utf-8")
        with atomic_path(path, suffix=".npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, grams=np.frombuffer(grams, dtype=np.uint8),
                         df=np.asarray(self._df, dtype=np.float64),
                         meta=np.array([fingerprint, str(self.n_images)]))

    def _load_df(self, path: Path, fingerprint: str) -> bool:
        if not path.is_file():
            return False
        try:
            with np.load(path) as data:
                if str(data["meta"][0]) != fingerprint:
                    return False
                grams = data["grams"].tobytes().decode("utf-8").split("\n")
                df = data["df"]
        except (OSError, KeyError, ValueError) as exc:
            raise EdgecapError(f"{path}: unreadable CIDEr-D cache ({exc}); delete it") from None
        for gram, count in zip(grams, df, strict=False):
            self._add(tuple(gram.split(" ")), float(count))
        return True

    # -- vectors ---------------------------------------------------------------------------
    def _vector(self, sentence: str, register: bool):
        """(ids, weights, norms[n], length) of one sentence.

        n-grams unseen in the corpus get idf log(N); candidates' unseen n-grams are not added
        to the table (they can match nothing), only counted in the norm.
        """
        counts = ngram_counts(sentence, self.n)
        norms = np.zeros(self.n)
        ids, tfs, extra = [], [], []
        length = 0
        for gram, tf in counts.items():
            k = len(gram) - 1
            if k == 1:
                length += tf
            idx = self._add(gram) if register else self._ids.get(gram)
            if idx is None:
                extra.append((k, tf * self.log_n))
            else:
                ids.append(idx)
                tfs.append(tf)
        idf = self._idf_array()
        ids_a = np.asarray(ids, dtype=np.int64)
        w = np.asarray(tfs, dtype=np.float64) * idf[ids_a] if ids else np.zeros(0)
        np.add.at(norms, np.asarray(self._order_of(ids_a), dtype=np.int64), w * w)
        for k, v in extra:
            norms[k] += v * v
        return ids_a, w, np.sqrt(norms), length

    def _order_of(self, ids: np.ndarray) -> np.ndarray:
        if len(self._order) != getattr(self, "_order_len", -1):
            self._order_arr = np.asarray(self._order, dtype=np.int64)
            self._order_len = len(self._order)
        return self._order_arr[ids]

    def _refs_vectors(self, refs: list[str]):
        key = tuple(refs)
        hit = self._ref_cache.get(key)
        if hit is None:
            vecs = [self._vector(r, register=True) for r in refs]
            hit = self._ref_cache[key] = vecs
        return hit

    # -- scoring -------------------------------------------------------------------------
    def score(self, candidates: list[str], refs: list[list[str]]) -> tuple[float, np.ndarray]:
        """(mean, per-item scores) of candidates[i] against refs[i]."""
        from scipy import sparse

        if len(candidates) != len(refs):
            raise EdgecapError(f"{len(candidates)} candidates but {len(refs)} reference lists")
        if not candidates:
            return 0.0, np.zeros(0)
        ref_vecs = []
        for i, r in enumerate(refs):
            if not r:
                raise EdgecapError(f"item {i}: empty reference list")
            ref_vecs.append(self._refs_vectors(list(r)))
        cand_vecs = [self._vector(c if isinstance(c, str) else "", register=False) for c in candidates]
        V = len(self._order)
        order = self._order_of(np.arange(V))

        def csr(vecs):
            indptr = np.cumsum([0] + [len(v[0]) for v in vecs])
            ids = np.concatenate([v[0] for v in vecs]) if indptr[-1] else np.zeros(0, np.int64)
            vals = np.concatenate([v[1] for v in vecs]) if indptr[-1] else np.zeros(0)
            return sparse.csr_matrix((vals, ids, indptr), shape=(len(vecs), V))

        flat_refs = [v for item in ref_vecs for v in item]
        n_refs = np.array([len(item) for item in ref_vecs])
        owner = np.repeat(np.arange(len(candidates)), n_refs)
        C = csr(cand_vecs)[owner]
        R = csr(flat_refs)
        # entries are >= 0, so the sparse minimum drops n-grams missing on either side
        M = C.minimum(R).multiply(R).tocoo()
        dots = np.bincount(M.row * self.n + order[M.col], weights=M.data,
                           minlength=len(flat_refs) * self.n).astype(np.float64).reshape(-1, self.n)
        c_norm = np.stack([v[2] for v in cand_vecs])[owner]
        r_norm = np.stack([v[2] for v in flat_refs])
        denom = c_norm * r_norm
        sims = np.divide(dots, denom, out=np.zeros_like(dots), where=denom != 0)
        delta = np.array([cand_vecs[o][3] for o in owner], float) - np.array([v[3] for v in flat_refs], float)
        per_ref = sims.mean(axis=1) * np.exp(-(delta ** 2) / (2 * self.sigma ** 2))
        scores = np.bincount(owner, weights=per_ref, minlength=len(candidates)) / n_refs * 10.0
        return float(scores.mean()), scores
