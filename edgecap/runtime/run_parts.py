"""Pieces the one-source run (`command.execute`) and the several-camera run
(`multicam.execute_cameras`) share: the default pace, when coverage loads in the background,
the --jsonl sink and the run's stderr line."""

from __future__ import annotations

import sys


def default_pace(source) -> str:
    """Cameras run live; folders and ACVR caption every frame; videos, synth and robot logs
    play at their own rate."""
    from .sources import ACVRSource, FolderSource

    if source.live:
        return "live"
    return "every" if isinstance(source, (ACVRSource, FolderSource)) else "native"


def coverage_in_background(settings, sources) -> bool:
    """--coverage-load: as asked, else in the background when every source is live (a camera
    or stream, whose first caption a restarted robot waits for)."""
    if settings.coverage_load is not None:
        return settings.coverage_load == "background"
    return all(source.live for source in sources)


def log(msg: str) -> None:
    print(f"edgecap run: {msg}", file=sys.stderr, flush=True)


def jsonl_sink(closing, settings, summary):
    """The --jsonl writer, closed by `closing` (an ExitStack), as a record sink; with --append
    the run opens with a run_start line and closes with a run_end line holding `summary`."""
    import contextlib

    from .records import RUN_END, JsonlWriter, run_start_record

    jsonl = closing.enter_context(contextlib.closing(JsonlWriter(settings.jsonl, settings.append)))
    if settings.append:
        jsonl.write(run_start_record(summary.source, settings.bundle, settings.area))
        # registered after closing(): runs first, so the summary line precedes the close
        closing.callback(lambda: jsonl.write({"kind": RUN_END, **summary.to_json()}))
    return lambda record: jsonl.write(record.to_json())
