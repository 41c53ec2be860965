"""Atomic file writes: write to a temporary file beside the target, then rename."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process umask, read without changing it where the kernel reports it (Linux >= 4.7);
    setting and restoring it would briefly give other threads' new files mode 0666."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ""):
    """Yield a temporary path in the target's directory; rename it onto `path` on success.

    Nothing is left behind when the body raises.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp creates 0600; give the final file the permissions a plain open() would
    os.chmod(tmp, 0o666 & ~current_umask())
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` itself or its closest ancestor that exists: where a new file would be created."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, force: bool = False):
    """Yield a temporary directory beside `path`; move it onto `path` on success.

    An existing `path` is refused unless `force`; with `force` it is replaced only once the
    new directory is complete.
    """
    from edgecap.errors import EdgecapError

    path = Path(path)
    if path.exists() and not force:
        raise EdgecapError(f"{path} already exists; pass --force to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    # mkdtemp creates 0700: a bundle or index read by another user (the robot's service
    # account) needs the permissions a plain mkdir would give
    os.chmod(tmp, 0o777 & ~current_umask())
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
