"""How edgecap writes: atomically, never over what it did not write, and tidy after a kill.

Every command that writes a file or a directory goes through here:

- `atomic_path` / `atomic_dir` build the output in a private work directory beside the target
  (`.NAME.XXXX.edgecap-tmp`) and rename it into place only once it is complete, so the target
  is never half-written.
- `check_replaceable` decides what an existing output directory may be replaced by: only an
  empty directory or, with --force, an edgecap directory of the same kind (`DirKind`) that
  holds nothing edgecap did not write. Anything else is refused, naming what would be lost.
- `check_file_target` does the same for a single file: it is replaced only when it is what
  the caller recognises as its own output (a report with its keys, a PNG with edgecap's mark).
- While a work directory is in use its writer holds an flock on its `lock` file. The kernel
  drops that lock when the writer dies, however it dies (SIGKILL, power loss), so a later
  write of the same target removes work directories whose lock it can take: they are proven
  orphans, not guessed ones.
- `probe_writable` creates (and removes) a file where the output will go, before slow work:
  `os.access` is not enough (root passes it on /proc and read-only mounts).
- `terminate_as_interrupt` turns SIGTERM / SIGHUP into an exception so that all of the above
  cleans up (Python's default for SIGTERM is to die without running `finally` blocks);
  `stop_on_signals` instead asks a long-running loop (`edgecap run`) to stop in order. They
  and `_signals_deferred` are the only places that touch signal handlers.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX (no file locks)
    fcntl = None

import shlex

from edgecap.errors import EdgecapError
from edgecap.jsonio import json_or_none

WORK_SUFFIX = ".edgecap-tmp"
LOCK_NAME = "lock"
OLD_NAME = "old"
# the new content is written under its own folder of the work directory, so no target name
# ("lock", "old") can land on the lock file or the displaced copy of the target
NEW_NAME = "new"
# errors that mean "cannot write there" wherever they happen, and those that do when they
# name a path we are writing; both are reported in one line instead of a traceback
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_WRITE_ERRNOS = (*_FULL_ERRNOS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                 errno.EEXIST, errno.ENAMETOOLONG)


# -- what a directory of ours looks like ------------------------------------------------------
@dataclass(frozen=True)
class DirKind:
    """A directory edgecap writes, recognised by a JSON marker file whose `key` holds `value`."""

    what: str                   # "bundle": used in messages
    marker: str                 # "manifest.json"
    key: str
    value: str
    entries: tuple[str, ...]    # glob patterns of the top-level names this kind writes

    def owns(self, directory: Path) -> bool:
        data = json_or_none(directory / self.marker)
        return isinstance(data, dict) and data.get(self.key) == self.value

    def foreign(self, directory: Path) -> list[str]:
        """Top-level names in `directory` this kind never writes (someone else put them there)."""
        return sorted(p.name for p in directory.iterdir()
                      if not any(fnmatch.fnmatchcase(p.name, pattern) for pattern in self.entries))


BUNDLE = DirKind("bundle", "manifest.json", "format", "edgecap-bundle",
                 # coverage_vectors.npz: coverage's word vectors (edgecap.metrics.glove.SUBSET_FILE)
                 ("manifest.json", "*.onnx", "*.onnx.data", "*.engine", "retrieval", "coverage_vectors.npz"))
RETRIEVAL_INDEX = DirKind("retrieval index", "index.json", "format", "edgecap-retrieval-index",
                          ("index.json", "index.faiss", "captions.json", "neighbours.npy"))
SYNTHETIC_WORLD = DirKind("synthetic world", "synth.json", "generator", "edgecap.data.synth",
                          ("synth.json", "dataset_coco.json", "objects.json", "images", "acvr", "video"))
KINDS = (BUNDLE, RETRIEVAL_INDEX, SYNTHETIC_WORLD)


def _files_listing(directory: Path, limit: int = 4, most: int = 10_000) -> str:
    """'3 files: a.txt, sub/b.csv, c' — what deleting `directory` would lose (counted up to
    `most`: `--out ~` must not walk a whole home directory to say no)."""
    files: list[str] = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        files += [os.path.relpath(os.path.join(root, n), directory) for n in sorted(names)]
        if len(files) > most:
            break
    count = f"more than {most}" if len(files) > most else str(len(files))
    shown = ", ".join(files[:limit]) + (", ..." if len(files) > limit else "")
    return f"{count} file{'s' * (len(files) != 1)}: {shown}" if files else "its empty subdirectories"


def check_replaceable(path: str | os.PathLike, kind: DirKind, force: bool, flag: str = "--out") -> None:
    """Fail (one line) unless `path` may become a new `kind`: absent, an empty directory, or
    with `force` an edgecap `kind` holding nothing but what edgecap writes into one."""
    path = Path(path)
    if not path.exists():
        if path.is_symlink():
            raise EdgecapError(f"{flag} {path} is a broken symbolic link; remove it or choose another {flag}")
        return
    if not path.is_dir():
        raise EdgecapError(f"{flag} {path} exists and is not a directory")
    try:
        if not any(path.iterdir()):
            return
    except OSError as exc:
        raise EdgecapError(f"{flag} {path} exists and cannot be read ({exc.strerror}); choose another {flag}") from None
    if not kind.owns(path):
        other = next((k for k in KINDS if k is not kind and k.owns(path)), None)
        what = (f"an edgecap {other.what}, not a {kind.what}" if other else
                f"not an edgecap {kind.what} (no {kind.marker} of ours)")
        raise EdgecapError(f"{flag} {path} is {what}; replacing it would delete {_files_listing(path)}; "
                           f"choose another {flag}")
    extra = kind.foreign(path)
    if extra:
        raise EdgecapError(f"{flag} {path} is an edgecap {kind.what} but also holds what edgecap did not write "
                           f"({', '.join(extra[:4])}{', ...' if len(extra) > 4 else ''}); move that out first "
                           f"or choose another {flag}")
    if not force:
        raise EdgecapError(f"{flag} {path} already exists; pass --force to replace it")


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` itself or its closest ancestor that exists: where a new file would be created."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def probe_writable(path: str | os.PathLike, flag: str = "--out", file: bool = False) -> None:
    """Fail (one line) unless a directory (or with `file`, a file) can be created at `path`."""
    path = Path(path)
    if path.is_dir() and path.parent == path:
        raise EdgecapError(f"{flag} {path}: cannot write to the file system root")
    if file and path.is_dir():
        raise EdgecapError(f"{flag} {path} is a directory; name a file")
    if path.exists() and not path.is_dir() and not path.is_file():
        raise EdgecapError(f"{flag} {path} exists and is not a regular file or directory")
    where = nearest_existing(Path(os.path.abspath(path)).parent)
    if not where.is_dir():
        raise EdgecapError(f"{flag} {path}: {where} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".edgecap-probe.", dir=where)
    except OSError as exc:
        raise EdgecapError(f"{flag} {path}: cannot create files in {where} ({exc.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def check_file_target(path: str | os.PathLike, is_ours, what: str, flag: str = "--out",
                      verb: str = "overwriting") -> None:
    """Fail (one line) unless a file may be written at `path`: nothing (or an empty file) is
    there, or what is there is `what` (`is_ours(path)`); then probe that it can be written.
    Called before slow work and again just before the write."""
    path = Path(path)
    if path.is_dir():
        raise EdgecapError(f"{flag} {path} is a directory; name a file")
    if path.is_file() and path.stat().st_size and not is_ours(path):
        raise EdgecapError(f"{flag} {path} exists and is not {what}; not {verb} it (choose another file)")
    probe_writable(path, flag, file=True)


def json_file_with(*keys: str):
    """`is_ours` for check_file_target: a JSON object holding all of `keys`."""
    def is_ours(path: Path) -> bool:
        data = json_or_none(path)
        return isinstance(data, dict) and set(keys) <= data.keys()
    return is_ours


def write_error(exc: OSError, target: Path, flag: str = "", within: Path | None = None) -> EdgecapError | None:
    """The one-line error for an OSError that means "cannot write `target`", else None.

    With `within`, an error naming a path is one only when that path lies under `within`
    (a missing input file read while writing is not a write error).
    """
    if exc.errno not in _WRITE_ERRNOS or _inside_a_work_dir(target):
        return None  # a file inside an output being built: its writer names that output
    if within is not None and exc.errno not in _FULL_ERRNOS:
        named = exc.filename and os.path.abspath(exc.filename).startswith(str(within) + os.sep)
        if not named:
            return None
    where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(target) else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where += f" ({free_space(target)})"
    return EdgecapError(f"cannot write {flag + ' ' if flag else ''}{target}: {exc.strerror or os.strerror(exc.errno)}"
                        f"{where}")


def _inside_a_work_dir(target: Path) -> bool:
    """Whether `target` lies in a work directory this process has open (manifest.json written
    into a bundle being built): an error there is the enclosing output's to report."""
    target = Path(os.path.abspath(target))
    return any(work.path is not None and work.path in target.parents for work in list(_OPEN))


def is_full(exc: BaseException) -> bool:
    """An OSError that says the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def free_space(path: str | os.PathLike) -> str:
    """'12 kB free on /mnt/card': what is left on the file system `path` is (or would be) on,
    for the one line a full disk gives."""
    where = nearest_existing(path)
    free = free_bytes(where)
    if free is None:
        return "free space unknown"
    mount = where
    while not os.path.ismount(mount) and mount.parent != mount:
        mount = mount.parent
    return f"{_human_bytes(free)} free on {mount}"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free for this user on the file system `path` is (or would be) on; None if unknown."""
    try:
        return shutil.disk_usage(nearest_existing(path)).free
    except OSError:
        return None


def _human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# -- work directories: private, locked, renamed into place -----------------------------------
def _log(message: str) -> None:
    print(f"edgecap: {message}", file=sys.stderr, flush=True)


def _try_lock(fd: int) -> bool:
    if fcntl is None:  # pragma: no cover - not POSIX: never prove a work directory orphaned
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def remove_orphans(target: str | os.PathLike) -> list[Path]:
    """Remove the work directories of earlier, dead writers of `target`; -> what was removed.

    A work directory is removed only when its lock can be taken, i.e. no living process holds
    it. One that still holds the previous `target` (a writer killed between the two renames
    of a replacement) gets it put back first.
    """
    target = Path(os.path.abspath(target))
    removed = []
    for work, alive in _locked_work_dirs(target):
        if alive:
            continue
        try:
            old = work / OLD_NAME
            if old.exists() and not os.path.lexists(target):
                os.replace(old, target)
                _log(f"restored {target} from an interrupted replacement")
            size = _size(work)
            _remove_tree(work)
            removed.append(work)
            _log(f"removed {work.name} ({size / 1e6:.1f} MB), left by an interrupted write of {target.name}")
        except OSError:
            continue
    return removed


def _lock_file(work: Path) -> Path:
    """The work directory's lock: `lock`, or the `.lock.*` it is made as (its writer holds the
    flock before the rename, so a kill between the two leaves that one to prove it orphaned)."""
    lock = work / LOCK_NAME
    if lock.exists():
        return lock
    pending = sorted(work.glob(".lock.*"))
    return pending[0] if pending else lock


def _work_dirs(target: Path) -> list[Path]:
    try:
        return [p for p in target.parent.glob(f".{glob_escape(target.name)}.*{WORK_SUFFIX}") if p.is_dir()]
    except OSError:
        return []


def _locked_work_dirs(target: Path):
    """(work directory, whether a living process holds its lock) for each of `target`'s work
    directories that has a lock file (one without is not provably orphaned, so it is left out).
    The lock is held, when it could be taken, until the caller moves to the next one."""
    for work in _work_dirs(target):
        try:
            fd = os.open(_lock_file(work), os.O_RDWR)
        except OSError:
            continue
        try:
            yield work, not _try_lock(fd)
        finally:
            os.close(fd)


def live_writers(target: str | os.PathLike) -> list[tuple[Path, dict]]:
    """(work directory, what its lock file says: pid, host, command) of every process that is
    writing `target` now: those whose lock cannot be taken."""
    target = Path(os.path.abspath(target))
    writers = []
    for work, alive in _locked_work_dirs(target):
        if alive:  # else an orphan: its writer is dead
            holder = json_or_none(_lock_file(work))
            writers.append((work, holder if isinstance(holder, dict) else {}))
    return writers


def _command_line() -> str:
    """This process's command line as a user would have typed it (for "pid N: edgecap run ...")."""
    argv = list(sys.argv)
    if argv and os.path.basename(argv[0]) in ("__main__.py", "cli.py"):
        argv[0] = "edgecap"
    elif argv:
        argv[0] = os.path.basename(argv[0])

    return shlex.join(argv)[:300]


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _remove_tree(work: Path) -> None:
    """Delete a work directory, its lock file last, so a half-removed one is never mistaken
    for an orphan by someone else while we still hold the lock. One already gone is fine: a
    signal can end a first removal half-way, and the cleanup after it removes what is left."""
    try:
        entries = list(work.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name == LOCK_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    with contextlib.suppress(OSError):
        (work / LOCK_NAME).unlink()
    with contextlib.suppress(OSError):
        work.rmdir()


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT / SIGTERM / SIGHUP back for a few steps that must happen together (creating
    and registering a work directory, the two renames of a replacement); a signal that arrives
    meanwhile is raised again, to its own handler, when the block ends."""
    pending: list[int] = []
    try:
        with _handled(STOP_SIGNALS, lambda signum, _frame: pending.append(signum), _not_ignored):
            yield
    finally:
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


# Work directories this process has open: whatever escapes a command (SIGTERM at any moment
# included) still gets them removed by `terminate_as_interrupt`.
_OPEN: set[WorkDir] = set()


class WorkDir:
    """`.NAME.XXXX.edgecap-tmp/` beside `target`, locked for as long as this process uses it.

    For outputs written over a long time (a video during a run); `atomic_path` and
    `atomic_dir` wrap it for everything written in one go.
    """

    def __init__(self, target: str | os.PathLike, flag: str = "", exclusive: bool = False):
        self.target, self.flag = _absolute(target, flag), flag
        self.fd: int | None = None
        self.path: Path | None = None
        self.committed = False
        # the folders made for the target, removed again (when empty) if nothing is committed:
        # a write that fails (a full disk) leaves no empty --out folder behind
        self._made = [d for d in (self.target.parent, *self.target.parent.parents) if not d.exists()]
        remove_orphans(self.target)
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            with _signals_deferred():  # no moment where the directory exists unregistered
                self.path = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", suffix=WORK_SUFFIX,
                                                  dir=self.target.parent))
                _OPEN.add(self)
                # The lock is taken before the file gets the name others look for, so whoever
                # sees a `lock` sees it held.
                self.fd, pending = tempfile.mkstemp(prefix=".lock.", dir=self.path)
                _try_lock(self.fd)
                os.write(self.fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                              "target": str(self.target),
                                              "command": _command_line()}).encode())
                os.replace(pending, self.path / LOCK_NAME)
                (self.path / NEW_NAME).mkdir()
        except OSError as exc:
            self.close()
            raise write_error(exc, self.target, flag) or exc from None
        if exclusive:
            self._refuse_other_writers()

    def _refuse_other_writers(self) -> None:
        """One writer per output: fail (one line naming the other process) when another living
        process has a work directory for the same target. Checked after ours is registered,
        so of two writers that start together at least one sees the other (both may refuse;
        neither ever writes over the other)."""
        others = [holder for work, holder in live_writers(self.target) if work != self.path]
        if others:
            self.close()
            who = others[0]
            raise EdgecapError(f"{self.flag + ' ' if self.flag else ''}{self.target} is being written by another "
                               f"process (pid {who.get('pid', '?')}: {who.get('command') or 'unknown command'}); "
                               "wait for it to finish or choose another file")

    def file(self, suffix: str = "") -> Path:
        """Where to write the target's content: its own name (so writers that look at the
        extension see the right one), plus `suffix` when it does not end with it already."""
        name = self.target.name
        return self.path / NEW_NAME / (name if not suffix or name.endswith(suffix) else name + suffix)

    def commit(self, tmp: Path) -> None:
        """Rename the finished `tmp` onto the target."""
        raise_lost_interrupt()
        try:
            os.replace(tmp, self.target)
        except OSError as exc:
            raise write_error(exc, self.target, self.flag, within=self.path) or exc from None
        self.committed = True

    def finish(self, complete, tmp: Path | None = None) -> None:
        """The ending of an output written over a run (a video, an MCAP or rerun log):
        `complete()` finishes the writer's file, which then goes onto the target; the work
        directory is removed whatever happens, so a writer that fails leaves nothing behind."""
        try:
            complete()
            self.commit(tmp or self.file())
        finally:
            self.close()

    def close(self) -> None:
        """Remove the work directory and release its lock. It may run twice (a second Ctrl-C
        in the middle of it, then `close_work_dirs`): each step is safe to repeat."""
        if self in _OPEN and self.path is not None:
            _remove_tree(self.path)
        fd, self.fd = self.fd, None  # cleared first: a second close must not close the fd again
        if fd is not None:
            os.close(fd)
        _OPEN.discard(self)
        if not self.committed:
            for folder in self._made:  # deepest first; one something else was put into stays
                with contextlib.suppress(OSError):
                    folder.rmdir()
            self._made = []


class RunOutput:
    """A file written over a run (an MCAP or rerun log) into `tmp`, in a WorkDir beside
    `target`, and moved onto the target by `close()` (once) after `_finish_file()` completes
    it; `abort()` drops it. Subclasses open `tmp` and write it."""

    def __init__(self, target: str | os.PathLike, flag: str):
        self._work = WorkDir(target, flag, exclusive=True)
        self.tmp = self._work.file()
        self._closed = False

    def _finish_file(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Finish the file and move it onto the target. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._work.finish(self._finish_file, self.tmp)

    def abort(self) -> None:
        """Drop the unfinished file (a run that failed, or a log that could not be finished)."""
        self._closed = True
        self._work.close()


def close_work_dirs() -> None:
    """Remove every work directory this process still has open (its command failed)."""
    for work in list(_OPEN):
        work.close()


def _absolute(path: str | os.PathLike, flag: str) -> Path:
    target = Path(os.path.abspath(path))
    if target.parent == target:
        raise EdgecapError(f"{flag} {path}: cannot write to the file system root")
    return target


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "", flag: str = ""):
    """Yield a temporary file path (ending in `suffix`); rename it onto `path` on success.

    Nothing is left behind when the body raises or the process is terminated.
    """
    work = WorkDir(path, flag)
    try:
        tmp = work.file(suffix)
        yield tmp
        work.commit(tmp)
    except OSError as exc:
        raise write_error(exc, work.target, flag, within=work.path) or exc from None
    finally:
        work.close()


@contextlib.contextmanager
def atomic_files(paths: list[str | os.PathLike], flag: str = ""):
    """Several files that make one output (a report and its charts), in a directory that may
    hold anything else: yield a temporary path for each (same name, in a work directory beside
    it); only once the block has written them all is each renamed onto its target. A failure
    (a full disk at the last chart) leaves every target as it was. A temporary the block did
    not write (a chart with nothing to draw) leaves its target alone."""
    works: list[WorkDir] = []
    try:
        for path in paths:
            works.append(WorkDir(path, flag))
        tmps = [work.file() for work in works]
        yield tmps
        for work, tmp in zip(works, tmps, strict=True):
            if tmp.exists():
                work.commit(tmp)
    except OSError as exc:  # named by the folder the output goes into: any of its files may have failed
        folder = Path(os.path.abspath(paths[0])).parent
        raise write_error(exc, folder, flag, within=folder) or exc from None
    finally:
        for work in reversed(works):  # the first made the folder: it goes last, once empty
            work.close()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, kind: DirKind, force: bool = False, flag: str = "--out"):
    """Yield a temporary directory beside `path`; move it onto `path` on success.

    An existing `path` is replaced only as `check_replaceable` allows (checked before and
    again just before the swap), and only once the new directory is complete.
    """
    target = _absolute(path, flag)
    check_replaceable(target, kind, force, flag)
    work = WorkDir(target, flag)
    try:
        tmp = work.file()
        tmp.mkdir()
        yield tmp
        raise_lost_interrupt()
        check_replaceable(target, kind, force, flag)
        old = work.path / OLD_NAME
        with _signals_deferred():
            if os.path.lexists(target):
                os.replace(target, old)
            try:
                os.replace(tmp, target)
            except OSError:
                if os.path.lexists(old):
                    os.replace(old, target)
                raise
            work.committed = True
    except OSError as exc:
        raise write_error(exc, target, flag, within=work.path) or exc from None
    finally:
        work.close()


def append_whole(fh, data: bytes, target: str | os.PathLike, flag: str = "") -> None:
    """Append `data` (whole lines) to the unbuffered binary file `fh` (open(..., "ab" or "wb",
    buffering=0)), which is written in place: a caption or metrics log that a killed run must
    leave readable. When the write fails part-way (a full disk), the file is cut back to where it
    was, so it still ends with a whole line, and the one-line error names the file (and the free
    space); nothing is left in a buffer to fail again when the file is closed."""
    start = os.fstat(fh.fileno()).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[fh.write(view):]
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fh.fileno(), start)
            fh.seek(start)  # a file opened "wb" would go on past the cut, leaving a hole of NUL bytes
        raise write_error(exc, Path(target), flag) or exc from None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks (bundle files and weights can be gigabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    write_text_atomic(path, json.dumps(obj, indent=indent) + "\n")


# -- signals ------------------------------------------------------------------------------------
# What ends a command from outside: Ctrl-C (SIGINT), a service manager, CI or `kill` (SIGTERM), a
# closed terminal (SIGHUP). Every way edgecap reacts to them is one of the context managers
# below, all installed by `_handled`.
STOP_SIGNALS = tuple(sig for sig in (getattr(signal, name, None) for name in ("SIGINT", "SIGTERM", "SIGHUP"))
                     if sig is not None)


@contextlib.contextmanager
def stop_signal_handlers_kept():
    """Within the block, code may install its own handlers for the stop signals; at its end,
    ours are back. `ray.init` sets the driver's SIGTERM to `sys.exit` and leaves it so after
    `ray.shutdown`: a SIGTERM would then skip the summary's `stopped_by` and exit 15, not 143."""
    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: installed from C, cannot be put back from Python
                signal.signal(sig, handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived; unwinds like Ctrl-C so `finally` blocks clean up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupt(signum, _frame):
    _UNDELIVERED.append(signum)
    SIGNALS_RECEIVED.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


# Interrupts raised by our handlers that no one has seen arrive yet. A handler runs between
# any two bytecodes, also where its exception cannot propagate: inside a finalizer (it only
# reaches sys.unraisablehook), or inside Python code that C code called and whose error it
# then clears (Cython modules registering their types with `abc` while numpy.random is first
# imported: a SIGTERM there vanished and `data synth` finished with exit 0). Whatever is still
# here at the next commit, or when the command returns, is raised again there.
_UNDELIVERED: list[int] = []


# Every stop signal our handlers saw in this process, handled or not. The `edgecap` command then
# ends at once after its exit handlers (__main__.exit_now): CPython may have marked a handled
# interrupt unhandled, and a further signal during the interpreter's slow teardown (spaCy,
# onnxruntime: seconds), after it has reset its handlers, would kill the process mid-exit.
SIGNALS_RECEIVED: list[int] = []


def interrupt_delivered() -> None:
    """The interrupt being handled arrived where it was meant to (an `except` that deals with
    it on purpose, e.g. `edgecap run` summarising after a second Ctrl-C)."""
    _UNDELIVERED.clear()


def raise_lost_interrupt() -> None:
    """Raise again an interrupt whose exception something swallowed: called before every
    commit (so nothing is published after a signal) and when a command returns."""
    if _UNDELIVERED:
        signum = _UNDELIVERED[0]
        _UNDELIVERED.clear()
        _raise_interrupt(signum, None)


@contextlib.contextmanager
def _delivering():
    """An interrupt escaping the block was delivered; one that did not, and was raised inside
    it, is raised again when the block ends."""
    try:
        yield
        raise_lost_interrupt()
    except KeyboardInterrupt:
        interrupt_delivered()
        raise
    except BaseException:
        # an interrupt that a library turned into its own error (onnxruntime's import reports
        # a SIGTERM that arrived inside it as an ImportError): the interrupt is what happened
        raise_lost_interrupt()
        raise


def _not_ignored(handler) -> bool:
    """SIG_IGN is someone's decision (`nohup`, a parent that ignores it, a shell's background
    job); None is a handler installed outside Python. Both are left alone."""
    return handler not in (signal.SIG_IGN, None)


@contextlib.contextmanager
def _handled(signals, handler, replaces):
    """Within the block, `handler` handles each of `signals` whose current handler
    `replaces(current)` accepts; the previous handlers are back afterwards.

    Python handlers rather than a signal mask: a mask only covers the calling thread, and
    Python runs its handlers in the main thread whichever thread the kernel picked. Handlers
    can only be changed from the main thread; elsewhere the block runs with them as they are.
    """
    saved = {}
    if _in_main_thread():
        for sig in signals:
            if replaces(signal.getsignal(sig)):
                saved[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def terminate_as_interrupt():
    """Within the block, SIGTERM and SIGHUP raise `Terminated` (where their disposition is
    still the default) and Ctrl-C `KeyboardInterrupt` as usual, and whatever escapes the block
    removes this process's open work directories. An interrupt that something swallowed is
    raised again before the next commit, or when the block ends. The CLI wraps every command
    in it."""
    def ours_to_replace(current) -> bool:
        return (current is signal.SIG_DFL or current is signal.default_int_handler
                or getattr(current, "edgecap_start_up", False))

    with _handled(STOP_SIGNALS, _raise_interrupt, ours_to_replace):
        try:
            with _delivering():
                yield
        except BaseException:
            close_work_dirs()
            raise


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event):
    """Within the block, the first SIGINT / SIGTERM / SIGHUP sets `stop`, for a loop that checks
    it to wind down in order (finish the batch in flight, close its outputs, summarise); the
    next one raises at once (`KeyboardInterrupt` for Ctrl-C, `Terminated` otherwise)."""
    def request_stop(signum, frame):
        if stop.is_set():
            _raise_interrupt(signum, frame)
        SIGNALS_RECEIVED.append(signum)
        stop.set()

    with _handled(STOP_SIGNALS, request_stop, _not_ignored), _delivering():
        yield


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stderr_lines():
    """Send whatever is written to file descriptor 2 (by child processes, C libraries such as
    FFmpeg or OpenCV) to a temporary file for the duration; the yielded list receives its lines
    on exit. For messages a library prints where we report the outcome ourselves. Anything
    another thread writes to stderr meanwhile is captured too, so keep the window short."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += sink.read().decode("utf-8", errors="replace").splitlines()
