"""Is an encoded image whole?

libjpeg decodes a JPEG that was cut short (a copy interrupted, a card pulled, a log written
by a process that died) into a picture whose lower part is grey, and says so only by printing
"Premature end of JPEG file" on stderr, without the file's name; OpenCV's `imread` returns that
picture as if it were whole. So the bytes are checked before they are decoded, by the markers
that every complete file ends with:

- JPEG: the end-of-image marker (FF D9) must follow the last start-of-scan marker (FF DA).
  Inside the entropy-coded data a FF byte is always followed by 00 or a restart marker, so the
  pair cannot occur there by chance; a progressive JPEG has one scan per pass, and the rule
  holds for its last one. Bytes after the end-of-image marker (some cameras append a trailer)
  are allowed.
- PNG: the IEND chunk must be there (libpng itself refuses most cut PNGs, but not all).
- Nothing at all (a file created but never written, a copy that died at once) is damage too:
  OpenCV's `imdecode` fails an assertion on an empty buffer instead of returning None.

Other formats are left to their decoder.
"""

from __future__ import annotations

JPEG_START, JPEG_SCAN, JPEG_END = b"\xff\xd8", b"\xff\xda", b"\xff\xd9"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def damage(data: bytes) -> str | None:
    """Why the encoded image `data` is not whole (one phrase), or None."""
    if not data:  # OpenCV's imdecode asserts on an empty buffer rather than returning None
        return "empty (0 bytes)"
    if data.startswith(JPEG_START):
        scan = data.rfind(JPEG_SCAN)
        if scan < 0:
            return "damaged JPEG: no image data (no start-of-scan marker)"
        if data.find(JPEG_END, scan + 2) < 0:
            return "damaged JPEG: cut short (no end-of-image marker after its last scan)"
    elif data.startswith(PNG_SIGNATURE) and data.rfind(b"IEND") < 0:
        return "damaged PNG: cut short (no IEND chunk)"
    return None
