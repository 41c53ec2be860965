"""Precomputed visual features in HDF5, in the layout of the M2 Transformer code.

One dataset per image, key `<image_id>_features`, shape [n, D] (n regions or grid cells; n may
differ between images, as with bottom-up detections). `FeatureStore.get` pads with zero rows or
truncates to a fixed `n_regions` (the static N every graph is exported with) and returns a mask
of the real rows. A missing key is an error naming the key and the file, never made-up
features.

Files that `FeatureWriter` writes carry attributes saying what produced them (backbone, weights
sha256, preprocessing) and a `complete` flag on each dataset, so an interrupted extraction can
continue where it stopped and a resumed run with different weights is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError, require

SUFFIX = "_features"
WRITER = "edgecap"  # root attribute of files FeatureWriter made (datasets carry `complete`)


def feature_key(image_id) -> str:
    return f"{image_id}{SUFFIX}"


class _HDF5File:
    """An open h5py file in `self._file`, closed once; usable as a context manager."""

    _file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FeatureStore(_HDF5File):
    """Read-only access to `<image_id>_features` datasets.

    n_regions: pad (zero rows) or truncate every entry to this many rows; None keeps each
        entry's own length (mask all True).
    mask_padding: when False the padded rows are marked visible too. Models imported from the
        official M2 code need this: that code never masked its zero-padded regions (see
        docs/pretrained.md).

    The HDF5 file is opened lazily, once per process, so the store can be handed to
    DataLoader workers.
    """

    def __init__(self, path: str | os.PathLike, n_regions: int | None = None, mask_padding: bool = True):
        self.path = Path(path)
        if not self.path.is_file():
            raise EdgecapError(f"features file {self.path} does not exist")
        if n_regions is not None and n_regions < 1:
            raise EdgecapError(f"n_regions={n_regions}, expected a positive count or None")
        self.n_regions = n_regions
        self.mask_padding = mask_padding
        self._file = None
        self._pid = None

    def _h5(self):
        if self._file is None or self._pid != os.getpid():
            h5py = require("h5py", "train", "HDF5 features")
            try:
                self._file = h5py.File(self.path, "r")
            except OSError as exc:
                raise EdgecapError(f"features file {self.path} is not a readable HDF5 file: {exc}") from exc
            self._pid = os.getpid()
        return self._file

    def __contains__(self, image_id) -> bool:
        return feature_key(image_id) in self._h5()

    def __len__(self) -> int:
        return sum(1 for k in self._h5().keys() if k.endswith(SUFFIX))

    def ids(self) -> list[str]:
        return [k[: -len(SUFFIX)] for k in self._h5().keys() if k.endswith(SUFFIX)]

    @property
    def attrs(self) -> dict:
        return {k: _attr_value(v) for k, v in self._h5().attrs.items()}

    def raw(self, image_id) -> np.ndarray:
        """The stored rows [n, D] as float32, without padding."""
        key = feature_key(image_id)
        h5 = self._h5()
        if key not in h5:
            raise EdgecapError(f"features file {self.path} has no key {key!r}")
        dataset = h5[key]
        if h5.attrs.get("writer") == WRITER and not dataset.attrs.get("complete", False):
            raise EdgecapError(
                f"features file {self.path}: {key!r} was left half-written by an interrupted extraction; "
                f"run edgecap features extract again to finish it"
            )
        data = dataset[()]
        if data.ndim != 2:
            raise EdgecapError(f"features file {self.path}: {key!r} has shape {data.shape}, expected [n, D]")
        data = np.asarray(data, dtype=np.float32)
        finite = np.isfinite(data)
        if not finite.all():  # a NaN row makes every caption the same word; refused, as index build refuses it
            bad = data.size - int(finite.sum())
            raise EdgecapError(f"features file {self.path}: {key!r} holds {bad} NaN or infinite values of "
                               f"{data.size}; a captioner cannot read them (extract the features again)")
        return data

    def get(self, image_id) -> tuple[np.ndarray, np.ndarray]:
        """-> (feats float32 [N, D], mask bool [N]) with N = n_regions (or the stored n)."""
        data = self.raw(image_id)
        n = data.shape[0] if self.n_regions is None else self.n_regions
        feats = np.zeros((n, data.shape[1]), dtype=np.float32)
        real = min(n, data.shape[0])
        feats[:real] = data[:real]
        mask = np.zeros(n, dtype=bool)
        mask[:real] = True
        if not self.mask_padding:
            mask[:] = True
        return feats, mask

    def get_batch(self, image_ids) -> tuple[np.ndarray, np.ndarray]:
        """-> (feats [B, N, D], mask [B, N]); needs a fixed n_regions."""
        if self.n_regions is None:
            raise EdgecapError("FeatureStore.get_batch needs n_regions (entries may differ in length)")
        pairs = [self.get(i) for i in image_ids]
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


    def __getstate__(self):  # picklable for DataLoader workers: the handle is reopened there
        state = dict(self.__dict__)
        state["_file"] = None
        state["_pid"] = None
        return state


def _attr_value(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value.item() if isinstance(value, np.generic) else value


class FeatureWriter(_HDF5File):
    """Append `<image_id>_features` datasets to an HDF5 file, resumably.

    `provenance` (backbone, weights sha256, preprocessing, ...) is stored as file attributes;
    reopening a file written with different provenance raises. Each dataset gets a
    `complete` attribute as its last write, so a dataset an interruption left half-written is
    deleted and redone on the next run instead of being trusted.
    """

    def __init__(self, path: str | os.PathLike, provenance: dict | None = None, dtype: str = "float32"):
        h5py = require("h5py", "train", "HDF5 features")
        self.path = Path(path)
        if self.path.is_dir():
            raise EdgecapError(f"features file {self.path} is a directory; --out names an HDF5 file (.h5)")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file where a folder of the path should be
            raise EdgecapError(f"features file {self.path}: cannot create {self.path.parent} "
                               f"({exc.strerror})") from None
        if dtype not in ("float32", "float16"):
            raise EdgecapError(f"feature dtype {dtype!r}, expected 'float32' or 'float16'")
        self.dtype = dtype
        if self.path.is_file() and self.path.stat().st_size and not h5py.is_hdf5(self.path):
            raise EdgecapError(f"features file {self.path} exists and is not an HDF5 file; not writing "
                               "over it: choose another --out")
        try:
            self._file = h5py.File(self.path, "a")
        except OSError as exc:
            raise EdgecapError(
                f"features file {self.path} cannot be opened for appending ({exc}); "
                f"if an earlier run was killed, delete it and run again"
            ) from exc
        try:
            self._check_ours()
            self._check_provenance(dict(provenance or {}))
            self._file.attrs["writer"] = WRITER
            self._drop_incomplete()
        except BaseException:
            self._file.close()
            raise

    def _check_ours(self) -> None:
        """Never append to an HDF5 file someone else wrote (e.g. the official M2 features)."""
        f = self._file
        if (len(f) or len(f.attrs)) and _attr_value(f.attrs.get("writer")) != WRITER:
            names = sorted(f)[:3]
            raise EdgecapError(f"features file {self.path} was not written by edgecap (it holds "
                               f"{', '.join(names)}{', ...' if len(f) > 3 else ''}); not appending to it: "
                               f"choose another --out")

    def _check_provenance(self, provenance: dict) -> None:
        attrs = self._file.attrs
        for key, value in provenance.items():
            encoded = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list, tuple)) else value
            if key in attrs:
                have = _attr_value(attrs[key])
                want = _attr_value(encoded)
                if have != want:
                    raise EdgecapError(
                        f"features file {self.path} was written with {key}={have!r}, this run has {want!r}; "
                        f"use another --out or delete the file"
                    )
            else:
                attrs[key] = encoded

    def _drop_incomplete(self) -> None:
        stale = [k for k, d in self._file.items() if k.endswith(SUFFIX) and not d.attrs.get("complete", False)]
        for key in stale:
            del self._file[key]

    def done_ids(self) -> set[str]:
        return {k[: -len(SUFFIX)] for k in self._file.keys() if k.endswith(SUFFIX)}

    def write(self, image_id, feats: np.ndarray) -> None:
        feats = np.asarray(feats)
        if feats.ndim != 2:
            raise EdgecapError(f"features for image {image_id} have shape {feats.shape}, expected [n, D]")
        key = feature_key(image_id)
        if key in self._file:
            del self._file[key]
        dataset = self._file.create_dataset(key, data=feats.astype(self.dtype))
        dataset.attrs["complete"] = True

    def flush(self) -> None:
        self._file.flush()

