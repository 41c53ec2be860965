"""Command-line values checked where they are parsed: the one place edgecap's options say
what they admit.

`Integer(low, high)` and `Number(low, high, above)` are argparse `type=` callables: a bad value
is refused while the command line is parsed, before anything is read or written, as one line
naming the option, the value and what was expected ("argument --beam: expected an integer
>= 1, got '0'"). A number must be finite (`nan` and `inf` parse as floats, and `--max-fps inf`
or `--min-area nan` would silently mean something else). The same objects check the values a
config file or a library caller gives (`check`), so the flag and the TOML key say the same.

Upper bounds are where a value names a size: far above any real use, low enough that a typo
(`--images 99999999999`) is refused instead of ending in an allocation failure.

`ListOf(kind)` reads a comma-separated list of them (a benchmark's --batch-sizes 1,2,4).

`Parser` is the ArgumentParser every `edgecap` command and benchmark script uses: its errors
are one line (argparse prints the whole usage block first, which for `edgecap run` is twenty
lines above the one that matters).
"""

from __future__ import annotations

import argparse
import math
import numbers
import os
from dataclasses import dataclass

from edgecap.errors import EdgecapError


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: "<prog>: error: <message> (see <prog> --help)", exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Bounded:
    """Parsing and checking shared by Integer and Number: `convert` reads the text, `admits`
    and `expected` say what the range allows."""

    convert = int
    shows_text = False  # out-of-range: echo the converted value (Integer) or the text (Number)

    def expected(self) -> str:
        raise NotImplementedError

    def admits(self, value) -> bool:
        raise NotImplementedError

    def __call__(self, text: str):
        try:
            value = self.convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, got {text!r}") from None
        if not self.admits(value):
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, got {text if self.shows_text else value}")
        return value

    def check(self, value, where: str):
        """`value` (from a config file or a caller), or the one-line error "<where> <value>: expected ..."."""
        if not self.admits(value):
            raise EdgecapError(f"{where} {value!r}: expected {self.expected()}")
        return value


@dataclass(frozen=True)
class Integer(_Bounded):
    """An integer in low..high (either end open when None)."""

    low: int | None = None
    high: int | None = None

    def expected(self) -> str:
        if self.low is not None and self.high is not None:
            return f"an integer in {self.low}..{self.high}"
        if self.low is not None:
            return f"an integer >= {self.low}"
        return "an integer" if self.high is None else f"an integer <= {self.high}"

    def admits(self, value) -> bool:
        return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                and (self.low is None or value >= self.low) and (self.high is None or value <= self.high))


@dataclass(frozen=True)
class Number(_Bounded):
    """A finite number >= low (or > above) and <= high (each bound optional)."""

    low: float | None = None
    high: float | None = None
    above: float | None = None
    convert = float
    shows_text = True

    def expected(self) -> str:
        parts = [f">= {self.low}" if self.low is not None else "", f"> {self.above}" if self.above is not None else "",
                 f"<= {self.high}" if self.high is not None else ""]
        return " ".join(["a finite number", " and ".join(p for p in parts if p)]).strip()

    def admits(self, value) -> bool:
        return (isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
                and (self.low is None or value >= self.low) and (self.above is None or value > self.above)
                and (self.high is None or value <= self.high))


@dataclass(frozen=True)
class ListOf:
    """A comma-separated list of `kind` values ("1,2,4"), at least one."""

    kind: Integer | Number

    def __call__(self, text: str) -> list:
        items = [x.strip() for x in str(text).split(",") if x.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {self.kind.expected()}s, got {text!r}")
        return [self.kind(x) for x in items]


COUNT = Integer(1)                  # images per pass, captions, neighbours, steps
SEED = Integer(0, 2**32 - 1)        # numpy's seeds are 32-bit
THREADS = Integer(0, 1024)          # 0: the library decides
IMAGE_SIDE = Integer(32, 2048)      # the synthetic world's renders
SYNTH_IMAGES = Integer(1, 1_000_000)  # synthetic Karpathy images (COCO has 123,287)
FRAME_COUNT = Integer(0, 1_000_000)   # synthetic ACVR sequences, video frames
SEQUENCE_FRAMES = Integer(1, 1_000_000)
FRONTEND_SIDE = Integer(0, 2048)    # a front end's input size; 0: its weights' own
SHEET_GRID = Integer(1, 16)         # the contact sheet: tiles per side ...
SHEET_TILE = Integer(32, 512)       # ... and the side of each
BEAM = Integer(1, 100)              # beams per image: a static graph dimension
BATCH = Integer(1, 1024)            # images per static graph
POSITIVE = Number(above=0)          # frames per second, milliseconds, seconds
FRACTION = Number(0, 1)             # an area fraction of an image


def processes() -> Integer:
    """Worker processes: 1..this machine's cores (more only contend, and each loads a model)."""
    return Integer(1, os.cpu_count() or 1)
