"""Reading JSON, JSON Lines and TOML files: the one way edgecap reads them.

A JSON document (`read_json`: a bundle's manifest.json, ACVR labels.json, COCO references and
instances, Karpathy's dataset_coco.json for training, `features extract` and the export's parity
data) is read as bytes, a UTF-8 byte order mark dropped, decoded strictly and
parsed; each failure is one line naming the file: "cannot read[ <what>] (<reason>)", "not
UTF-8 text (byte N)", "invalid JSON at line N: <reason>". TOML files (`read_toml`: `edgecap run
--config`, export presets, training configs) are decoded the same way (`read_text`).

Three kinds of file are JSON Lines: the caption logs `edgecap run --jsonl` writes
(`edgecap.contract.runlog.read_runs`), caption files for `edgecap eval`
(`edgecap.metrics.captions.read_captions`) and `--detections` files
(`edgecap.runtime.detections`). All of them are read here, the same way:

- the file is read as bytes; an OSError is a one-line error naming the file (`read_bytes`);
- it is split into lines on the bytes (b"\\n", b"\\r\\n", b"\\r"), never on the decoded text, whose
  `splitlines` would also cut at U+2028 or U+0085 inside a caption;
- blank lines are skipped; line numbers count every line, blank ones included, as an editor does;
- a UTF-8 byte order mark (PowerShell's `Out-File`, Notepad) is dropped from the first line;
- a line that is not UTF-8 is decoded with U+FFFD in place of the bad bytes and still parsed,
  and says so (`JsonLine.utf8`).

Readers of logs, which a killed process may leave with a half line, count what is not a JSON
object and go on (`read_objects`); a reader of input that must be right (`--detections`)
stops at the first such line with its number (`json_lines`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError

BOM = b"\xef\xbb\xbf"


def read_bytes(path: str | os.PathLike, what: str = "", where: str | None = None) -> bytes:
    """The file's bytes, or the one-line error "<where>: cannot read[ <what>] (<reason>)";
    `where` is the path unless the caller names it otherwise (the flag that gave it)."""
    where = str(Path(path)) if where is None else where
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise EdgecapError(f"{where}: cannot read{' ' + what if what else ''} ({exc.strerror or exc})") from None


def read_text(path: str | os.PathLike, what: str = "", where: str | None = None) -> str:
    """The file's text (UTF-8, a byte order mark dropped), or a one-line error naming it."""
    where = str(Path(path)) if where is None else where
    raw = read_bytes(path, what, where)
    skip = len(BOM) if raw.startswith(BOM) else 0
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgecapError(f"{where}: not UTF-8 text (byte {exc.start + skip})") from None


def read_json(path: str | os.PathLike, what: str = "", where: str | None = None):
    """The JSON document in the file (any JSON value), or a one-line error naming it."""
    where = str(Path(path)) if where is None else where
    return parse_json(read_text(path, what, where), where)


def json_or_none(path: str | os.PathLike):
    """The JSON document in `path` as `read_json` reads it, or None when it cannot be read or
    parsed: for the question "did edgecap write this?" (an ownership marker, a report or stamp
    file a command would replace), where a file that is not JSON is simply not ours."""
    try:
        return read_json(path)
    except EdgecapError:
        return None


def read_toml(path: str | os.PathLike, what: str = "", where: str | None = None) -> dict:
    """The TOML document in the file (`edgecap run --config`, an export preset, a training
    config), or a one-line error naming it: "<where>: invalid TOML: <reason> (at line N...)"."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    where = str(Path(path)) if where is None else where
    try:
        return tomllib.loads(read_text(path, what, where))
    except tomllib.TOMLDecodeError as exc:
        raise EdgecapError(f"{where}: invalid TOML: {exc}") from None


def parse_json(text: str, where: str):
    """json.loads, or the one-line error "<where>: invalid JSON at line N: <reason>"."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise EdgecapError(f"{where}: invalid JSON at line {exc.lineno}: {exc.msg}") from None


@dataclass(frozen=True)
class JsonLine:
    number: int                 # 1-based, as an editor counts lines
    value: object = None        # the parsed JSON value (None when `error`)
    error: str | None = None    # "invalid JSON: <reason>" when the line does not parse
    utf8: bool = True           # False: bytes that are not UTF-8 were read as U+FFFD


def json_lines(raw: bytes) -> Iterator[JsonLine]:
    """Every non-blank line of a JSON Lines file, parsed (or with the reason it does not parse)."""
    for number, line in enumerate(raw.splitlines(), 1):
        if number == 1 and line.startswith(BOM):
            line = line[len(BOM):]
        if not line.strip():
            continue
        try:
            text, utf8 = line.decode("utf-8"), True
        except UnicodeDecodeError:
            text, utf8 = line.decode("utf-8", errors="replace"), False
        try:
            yield JsonLine(number, json.loads(text), utf8=utf8)
        except json.JSONDecodeError as exc:  # e.g. a half line left by a killed process
            yield JsonLine(number, error=f"invalid JSON: {exc.msg}", utf8=utf8)


@dataclass
class JsonObjects:
    """The JSON objects of a JSON Lines file, in order, and a count of every other line."""

    objects: list[dict] = field(default_factory=list)
    malformed: int = 0          # lines that are not JSON
    non_objects: int = 0        # JSON values that are not objects (a bare number, a list)
    non_utf8: int = 0           # lines with bytes that are not UTF-8 (still parsed, with U+FFFD)


def read_objects(raw: bytes) -> JsonObjects:
    """The JSON objects of `raw`, skipping (and counting) every line that is not one."""
    out = JsonObjects()
    for line in json_lines(raw):
        out.non_utf8 += not line.utf8
        if line.error is not None:
            out.malformed += 1
        elif not isinstance(line.value, dict):
            out.non_objects += 1
        else:
            out.objects.append(line.value)
    return out
