"""Reading caption files for evaluation: COCO results JSON or the runtime's JSONL.

Accepted inputs:

- COCO results format: a JSON list of {"image_id": ..., "caption": "..."}.
- JSON Lines, one record per line, as `edgecap run` writes: {"image_id": ..., "caption": ...},
  or {"source": ..., "frame_id": ..., "caption": ...} when there is no image id; the image id
  is then "<last path component of source>/<frame_id>", which is the ACVR image id when the
  source is a sequence folder. Other fields are ignored. A record without a "caption" (or with
  null, e.g. one carrying an "error") counts as an empty caption; a caption that is not a
  string (a number, a list) makes the record malformed. Lines with a "kind" field are not
  captions: `edgecap run --append` opens and closes each run with one ("run_start",
  "run_end"); they are skipped and counted as run markers.

Nothing here crashes on dirty input: malformed records and JSONL lines are skipped and counted,
and so is a record whose caption holds bytes that are not UTF-8 (scored, it would lose a word
without a sign): `CaptionFile.skipped` names their image ids. Only a file with no usable record
is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.jsonio import json_lines, parse_json, read_bytes


@dataclass
class CaptionFile:
    path: Path
    captions: dict[str, str]                       # image id -> caption (first occurrence)
    counts: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> image ids left out

    def skip_lines(self) -> list[str]:
        """One line per reason records were left out, naming up to 5 of their image ids."""
        out = []
        for why, ids in self.skipped.items():
            shown = ", ".join(repr(i) for i in ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            out.append(f"{self.path}: {len(ids)} record{'s' * (len(ids) != 1)} skipped, {why}: {shown}")
        return out


def _record_id(rec: dict) -> str | None:
    if rec.get("image_id") is not None:
        return str(rec["image_id"])
    if rec.get("frame_id") is not None and rec.get("source") is not None:
        source = str(rec["source"]).rstrip("/\\").replace("\\", "/")
        return f"{source.rsplit('/', 1)[-1]}/{rec['frame_id']}"
    return None


def read_captions(path: str | Path, normalize=None) -> CaptionFile:
    """Read a caption file; `normalize` maps raw image ids to the keys used for matching."""
    path = Path(path)
    raw = read_bytes(path, "caption file")
    counts = {"records": 0, "duplicates": 0, "malformed_records": 0, "non_utf8_records": 0,
              "missing_caption": 0, "empty_captions": 0, "run_markers": 0}
    records: list[tuple[object, bool]] = []  # (record, its bytes were all UTF-8)
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip("\ufeff \t\r\n").startswith("["):
        parsed = parse_json(text.removeprefix("\ufeff"), str(path))  # its own line numbers
        if not isinstance(parsed, list):
            raise EdgecapError(f"{path}: expected a JSON list of {{image_id, caption}}")
        # U+FFFD that decoding put there (not one the file spells out) marks bytes that are not UTF-8
        replaced = "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", errors="ignore")
        records = [(r, not (replaced and isinstance(r, dict) and "\ufffd" in str(r.get("caption", ""))))
                   for r in parsed]
    else:
        for line in json_lines(raw):
            if line.error is not None or not isinstance(line.value, dict):
                counts["malformed_records"] += 1
            else:
                records.append((line.value, line.utf8 or "\ufffd" not in str(line.value.get("caption", ""))))
    captions: dict[str, str] = {}
    skipped: dict[str, list[str]] = {}
    for rec, utf8 in records:
        if not isinstance(rec, dict):
            counts["malformed_records"] += 1
            continue
        if "kind" in rec:
            counts["run_markers"] += 1
            continue
        image_id = _record_id(rec)
        caption = rec.get("caption")
        if image_id is None or not (caption is None or isinstance(caption, str)):
            counts["malformed_records"] += 1
            if image_id is not None:
                skipped.setdefault("caption not a string", []).append(image_id)
            continue
        if not utf8:
            counts["non_utf8_records"] += 1
            skipped.setdefault("caption bytes not UTF-8", []).append(image_id)
            continue
        counts["records"] += 1
        if caption is None:
            counts["missing_caption"] += 1
            caption = ""
        if not caption.strip():
            counts["empty_captions"] += 1
        key = normalize(image_id) if normalize else image_id
        if key in captions:
            counts["duplicates"] += 1
            continue
        captions[key] = caption
    if not captions:
        raise EdgecapError(
            f"{path}: no caption records found (expected a JSON list of {{\"image_id\", \"caption\"}} "
            "or JSON Lines with image_id / source + frame_id and caption)"
        )
    return CaptionFile(path, captions, counts, skipped)
