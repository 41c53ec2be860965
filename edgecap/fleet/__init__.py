"""A fleet's robot logs captioned on a Ray cluster: `edgecap fleet BUNDLE LOGS... --out DIR`.

    plan.py     which logs (discovery, one name each), where their outputs go, which are finished
    reading.py  a Ray Data CPU task: one log's images decoded by edgecap's own sources, as rows
    actor.py    the caption actor: opens the bundle once, captions rows as `edgecap run` does
    outputs.py  the driver side: a log's rows gathered, its caption logs and dataset part written
    job.py      the Ray side: joining or starting a cluster, resources, the pipeline, progress
    command.py  the command line

This package is the only one that imports Ray; the runtime and the robot never import it.
docs/fleet.md says how to run it locally and on a cluster.
"""
