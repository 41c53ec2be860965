"""Reading caption files for evaluation: COCO results JSON or the runtime's JSONL.

Accepted inputs:

- COCO results format: a JSON list of {"image_id": ..., "caption": "..."}.
- JSON Lines, one record per line, as `edgecap run` writes: {"image_id": ..., "caption": ...},
  or {"source": ..., "frame_id": ..., "caption": ...} when there is no image id; the image id
  is then "<last path component of source>/<frame_id>", which is the ACVR image id when the
  source is a sequence folder. Other fields are ignored. A record without a "caption" string
  (e.g. one carrying an "error") counts as an empty caption. Lines with a "kind" field are not
  captions: `edgecap run --append` opens and closes each run with one ("run_start",
  "run_end"); they are skipped and counted as run markers.

Nothing here crashes on dirty input: undecodable bytes are replaced (and counted), malformed
JSONL lines are skipped (and counted); only a file with no usable record is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgecap.errors import EdgecapError


@dataclass
class CaptionFile:
    path: Path
    captions: dict[str, str]                       # image id -> caption (first occurrence)
    counts: dict[str, int] = field(default_factory=dict)


def _record_id(rec: dict) -> str | None:
    if rec.get("image_id") is not None:
        return str(rec["image_id"])
    if rec.get("frame_id") is not None and rec.get("source") is not None:
        source = str(rec["source"]).rstrip("/\\").replace("\\", "/")
        return f"{source.rsplit('/', 1)[-1]}/{rec['frame_id']}"
    return None


def read_captions(path: str | Path, normalize=None) -> CaptionFile:
    """Read a caption file; `normalize` maps raw image ids to the keys used for matching."""
    from edgecap.jsonio import parse_json, read_bytes, read_objects

    path = Path(path)
    raw = read_bytes(path, "caption file")
    counts = {"records": 0, "duplicates": 0, "malformed_records": 0, "non_utf8_records": 0,
              "missing_caption": 0, "empty_captions": 0, "run_markers": 0}
    records: list = []
    text = raw.decode("utf-8", errors="replace")
    if text.lstrip("\ufeff \t\r\n").startswith("["):
        parsed = parse_json(text.removeprefix("\ufeff"), str(path))  # its own line numbers
        if not isinstance(parsed, list):
            raise EdgecapError(f"{path}: expected a JSON list of {{image_id, caption}}")
        records = parsed
        if "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", errors="ignore"):
            counts["non_utf8_records"] = sum(
                1 for r in records if isinstance(r, dict) and "\ufffd" in str(r.get("caption", "")))
    else:
        lines = read_objects(raw)
        records = lines.objects
        counts.update(malformed_records=lines.malformed + lines.non_objects, non_utf8_records=lines.non_utf8)
    captions: dict[str, str] = {}
    for rec in records:
        if not isinstance(rec, dict):
            counts["malformed_records"] += 1
            continue
        if "kind" in rec:
            counts["run_markers"] += 1
            continue
        image_id = _record_id(rec)
        if image_id is None:
            counts["malformed_records"] += 1
            continue
        counts["records"] += 1
        caption = rec.get("caption")
        if not isinstance(caption, str):
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
    return CaptionFile(path, captions, counts)
