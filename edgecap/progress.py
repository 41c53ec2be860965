"""Progress bars: one rule for every long command.

A bar is drawn only when standard error is a terminal and the user did not pass --quiet.
Into a pipe or a log file (`edgecap data synth ... 2> synth.log`, a systemd unit, CI) a tqdm
bar is hundreds of carriage-return redraws that bury the lines that matter, so it is off
there; the messages a command prints (validation scores, counts, errors) are not bars and
are printed either way.
"""

from __future__ import annotations

import sys


def bar_wanted(quiet: bool = False, stream=None) -> bool:
    """True when a progress bar should be drawn on `stream` (default: standard error)."""
    if quiet:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(iterable=None, *, quiet: bool = False, **options):
    """A tqdm bar on standard error that follows `bar_wanted`; disabled, it still iterates,
    counts and writes messages (tqdm's own no-op mode), so callers need no second path."""
    from tqdm import tqdm

    return tqdm(iterable, file=sys.stderr, disable=not bar_wanted(quiet), dynamic_ncols=True, **options)
