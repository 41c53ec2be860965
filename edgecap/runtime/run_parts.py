"""Pieces the one-source run (`command.execute`) and the several-camera run
(`multicam.execute_cameras`) share: the default pace, when coverage loads in the background
and the run's stderr line (their record sinks: run_sinks.py)."""

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

