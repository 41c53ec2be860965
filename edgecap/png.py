"""PNG files edgecap writes (charts, contact sheets, captioned frames) carry a `Software`
text chunk naming edgecap, so a later write can tell its own picture from a user's photo of
the same name and replace only the former (docs/outputs.md).

Charts go through matplotlib (`save_figure`), frames through OpenCV (`save_image`); OpenCV
cannot write text chunks, so its encoded PNG gets the chunk inserted after the header, as the
PNG specification lays out (length, type, data, CRC-32 of type and data)."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from edgecap.errors import EdgecapError
from edgecap.io import atomic_path, check_file_target

SOFTWARE = "edgecap"
SIGNATURE = b"\x89PNG\r\n\x1a\n"
WHAT = "a PNG edgecap wrote"


def _text_chunk(keyword: str, text: str) -> bytes:
    body = b"tEXt" + keyword.encode("latin-1") + b"\0" + text.encode("latin-1")
    return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))


def is_ours(path: str | os.PathLike) -> bool:
    """A PNG whose text chunks, before its image data, say Software=edgecap."""
    try:
        with open(path, "rb") as fh:
            if fh.read(8) != SIGNATURE:
                return False
            while True:
                head = fh.read(8)
                if len(head) < 8:
                    return False
                length, kind = struct.unpack(">I4s", head)
                if kind in (b"IDAT", b"IEND") or length > 1 << 20:
                    return False
                data = fh.read(length + 4)[:length]
                if kind == b"tEXt" and data.partition(b"\0")[::2] == (b"Software", SOFTWARE.encode()):
                    return True
    except OSError:
        return False


def check_target(path: str | os.PathLike, flag: str = "--out") -> None:
    """Before the work: `path` may become a PNG of ours (absent, or a PNG edgecap wrote)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise EdgecapError(f"{flag} {path}: expected a .png file name")
    check_file_target(path, is_ours, WHAT, flag)


def save_image(image, path: str | os.PathLike, flag: str = "--out", checked: bool = False) -> Path:
    """A BGR image (OpenCV's layout) as a marked PNG, written atomically (over a file of
    ours only, unless the caller has `checked` the target by a rule of its own)."""
    import cv2

    if not checked:
        check_target(path, flag)
    ok, encoded = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        raise EdgecapError(f"{flag} {path}: OpenCV could not encode the image as PNG")
    data = encoded.tobytes()
    header_end = len(SIGNATURE) + 8 + 13 + 4  # the IHDR chunk always comes first
    with atomic_path(path, suffix=".png", flag=flag) as tmp:
        tmp.write_bytes(data[:header_end] + _text_chunk("Software", SOFTWARE) + data[header_end:])
    return Path(path)


def save_figure(fig, path: str | os.PathLike, dpi: int = 110, flag: str = "--out", checked: bool = False) -> Path:
    """A matplotlib figure as a marked PNG, written atomically (the figure is left open); over
    a file of ours only, unless the caller has `checked` the target by a rule of its own."""
    if not checked:
        check_target(path, flag)
    with atomic_path(path, suffix=".png", flag=flag) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi, metadata={"Software": SOFTWARE})
    return Path(path)
