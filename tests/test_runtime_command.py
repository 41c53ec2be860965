"""`edgecap run` options: the TOML config (robot/edgecap-runtime.toml), precedence, errors."""

import argparse
from pathlib import Path

import pytest

from edgecap.errors import EdgecapError
from edgecap.runtime.command import add_arguments, read_config, settings_from_args

ROBOT = Path(__file__).resolve().parents[1] / "robot"


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_sample_robot_config_is_valid():
    settings = settings_from_args(_args("--config", str(ROBOT / "edgecap-runtime.toml")))
    assert settings.bundle == "/opt/edgecap/bundle" and settings.source == "0"
    assert settings.beam == 3 and settings.max_fps == 5.0 and settings.latency_budget == 250.0
    assert settings.quiet is True and settings.coverage is True and settings.batch == 1


def test_flags_override_the_config_and_paths_are_relative_to_it(tmp_path):
    cfg = tmp_path / "conf" / "run.toml"
    cfg.parent.mkdir()
    cfg.write_text('bundle = "b"\nsource = "synth://tabletop"\nbeam = 3\njsonl = "out/c.jsonl"\n'
                   'coverage = false\nproviders = "CUDAExecutionProvider, CPUExecutionProvider"\n')
    s = settings_from_args(_args("--config", str(cfg), "--beam", "1", "--coverage"))
    assert s.beam == 1 and s.coverage is True
    assert s.bundle == str((cfg.parent / "b").resolve())
    assert s.jsonl == str((cfg.parent / "out" / "c.jsonl").resolve())
    assert s.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    s = settings_from_args(_args("given-bundle", "--config", str(cfg)))
    assert s.bundle == "given-bundle" and s.coverage is False and s.spin is True
    cfg.write_text('bundle = "b"\nsource = "0"\nspin = false\n')
    assert settings_from_args(_args("--config", str(cfg))).spin is False
    assert settings_from_args(_args("--config", str(cfg), "--spin")).spin is True


def test_a_config_next_to_its_data_finds_its_source_there(tmp_path, monkeypatch):
    """source, like bundle and jsonl, is relative to the config's folder when it names a file
    or folder; a camera index and a URL stay as written."""
    cfg = tmp_path / "robot" / "run.toml"
    (tmp_path / "robot" / "clips").mkdir(parents=True)
    (tmp_path / "robot" / "clips" / "a.mp4").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    for written, want in (("clips/a.mp4", str(tmp_path / "robot" / "clips" / "a.mp4")), ("0", "0"),
                          ("synth://tabletop?seed=1", "synth://tabletop?seed=1"), ("rtsp://cam/1", "rtsp://cam/1"),
                          ("/dev/video0", "/dev/video0"), ("not-yet/b.mp4", str(tmp_path / "robot" / "not-yet" / "b.mp4"))):
        cfg.write_text(f'bundle = "b"\nsource = "{written}"\n')
        assert read_config(str(cfg))["source"] == want
    # a path written from where edgecap runs (the rule before 24 Nov 2026 for source) is named, not taken
    (tmp_path / "here.mp4").write_bytes(b"x")
    cfg.write_text('bundle = "b"\nsource = "here.mp4"\n')
    with pytest.raises(EdgecapError) as info:
        read_config(str(cfg))
    assert str(info.value) == (f"--config {cfg}: source = 'here.mp4' is relative to the config's folder, and "
                               f"{tmp_path / 'robot' / 'here.mp4'} does not exist ({tmp_path / 'here.mp4'} does: "
                               "write that path in the config)")


@pytest.mark.parametrize("text, message", [
    ('sorce = "0"', "unknown key 'sorce' (did you mean 'source'?)"),
    ('beam = "three"', "beam = 'three' has the wrong type: expected an integer"),
    ("quiet = 1", "quiet = 1 has the wrong type: expected true or false"),
    ("beam = true", "wrong type: expected an integer"),
    ("source = 0", "source = 0 has the wrong type: expected a string in quotes"),
    ('max_fps = "5"', "max_fps = '5' has the wrong type: expected a number"),
    ("beam = [", "invalid TOML"),
])
def test_bad_config_names_the_key(tmp_path, text, message):
    cfg = tmp_path / "run.toml"
    cfg.write_text(text + "\n")
    with pytest.raises(EdgecapError) as info:
        read_config(str(cfg))
    assert message in str(info.value) and str(cfg) in str(info.value)


def test_bundle_and_source_are_required():
    with pytest.raises(EdgecapError, match="no bundle given"):
        settings_from_args(_args("--source", "0"))
    with pytest.raises(EdgecapError, match="no source given"):
        settings_from_args(_args("bundle"))


def test_the_systemd_unit_appends_to_the_jsonl():
    """Restart=on-failure restarts the loop after a camera loss; each start must not wipe the
    captions the earlier runs wrote."""
    import shlex

    unit = (ROBOT / "edgecap.service").read_text()
    assert "Restart=on-failure" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start.split("=", 1)[1])
    assert argv[1] == "run"
    settings = settings_from_args(_args(*[a.replace("/etc/edgecap", str(ROBOT)) for a in argv[2:]]))
    assert settings.append is True and settings.jsonl == "/var/lib/edgecap/captions.jsonl"


def test_append_needs_a_jsonl_file():
    with pytest.raises(EdgecapError, match="--append adds to the --jsonl file"):
        settings_from_args(_args("b", "--source", "0", "--append"))


def test_a_bundle_that_is_not_there_says_what_makes_one(tmp_path, run_cli):
    """`edgecap run bundles/demo ...` copied from the README before any export."""
    code, _, err = run_cli("run", tmp_path / "bundles" / "demo", "--source", "0")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert f"bundle {tmp_path / 'bundles' / 'demo'} does not exist: a bundle is the folder `edgecap export" in err
    assert "edgecap demo` leaves one in demo-out/bundle" in err
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli("run", tmp_path / "file", "--source", "0")
    assert code == 1 and "is not a directory" in err


def test_a_stream_urls_password_stays_out_of_records_summary_and_console(tmp_path, capsys):
    """A stream URL with credentials (an HTTP server serving a video: FFmpeg opens it as a
    stream): records, the summary and the console show it with the password masked."""
    import functools
    import http.server
    import io
    import json
    import threading

    from runtime_helpers import FakeBundle

    from edgecap.data.synth import generate_dataset
    from edgecap.runtime.captioner import Captioner
    from edgecap.runtime.command import RunSettings, execute

    world = tmp_path / "world"
    generate_dataset(world, 1, size=32, sequences=0, video_frames=10, progress=False)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(world / "video"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://robot:hunter2@127.0.0.1:{server.server_address[1]}/tabletop.mp4"
        jsonl, out = tmp_path / "run.jsonl", io.StringIO()
        summary, error = execute(Captioner(FakeBundle()), RunSettings(source=url, jsonl=str(jsonl), frames=2,
                                                                      append=True), out=out)
    finally:
        server.shutdown()
        server.server_close()
    assert error is None and summary.captioned == 2
    shown = f"http://robot:***@127.0.0.1:{server.server_address[1]}/tabletop.mp4"
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert {line.get("source") for line in lines if "source" in line} == {shown}
    assert json.loads((tmp_path / "run.summary.json").read_text())["source"] == shown
    assert "hunter2" not in jsonl.read_text() + out.getvalue() + capsys.readouterr().err
