"""Errors a user can act on. The CLI prints their message on one line and exits non-zero."""

import difflib
import importlib
import sys


class EdgecapError(Exception):
    """A user-facing error: bad input, a missing file, an unsupported option."""


class MissingExtraError(EdgecapError):
    """An optional dependency is not installed."""

    def __init__(self, module: str, extra: str, purpose: str = ""):
        what = f" ({purpose})" if purpose else ""
        super().__init__(
            f"{module} is not installed{what}: pip install \"edgecap[{extra}]\""
        )
        self.module = module
        self.extra = extra


def require(module: str, extra: str, purpose: str = ""):
    """Import an optional dependency or raise a one-line MissingExtraError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc


def did_you_mean(name: str, choices) -> str:
    """' (did you mean X?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def warn(message: str) -> None:
    """One line on stderr about something that will waste the user's time, said before it does."""
    print(f"edgecap: warning: {message}", file=sys.stderr, flush=True)


def random_front_end(backbone: str, fix: str) -> str:
    """The warning every command gives about a front end with seeded random weights."""
    return (f"the {backbone} front end has random weights: its features hardly differ between images, and a "
            f"captioner trained on them says one caption for all; {fix}")
