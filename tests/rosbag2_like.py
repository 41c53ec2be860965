"""Robot logs laid out as `ros2 bag record` writes them, built without ROS and without edgecap's
own writer: raw sqlite3 with rosbag2's table schema, MCAP files from the mcap library configured
as rosbag2's MCAP storage plugin configures its writer, and metadata.yaml as rosbag2 prints it.

What each distro writes (read from the rosbag2 sources, branches humble and jazzy):

- metadata.yaml: Humble writes version 5 (each topic's `offered_qos_profiles` a YAML *string*,
  QoS policies as integers); Jazzy writes version 9 (`offered_qos_profiles` a YAML list with
  policy names, `type_description_hash`, `custom_data`, `ros_distro`). Iron's 6 / 7 / 8 sit in
  between. It is written only when the recording stops: a killed recording has none.
- SQLite3 (`.db3`): Humble's schema version 3 (tables schema, metadata, topics, messages);
  Jazzy's version 4 adds `topics.type_description_hash` and a `message_definitions` table. The
  `resilient` preset records with `journal_mode=WAL`; a recording killed with that preset leaves
  its latest messages in `<file>.db3-wal` beside the database.
- MCAP: profile `ros2`, one schema per type (`ros2msg` text: the .msg file with its comments,
  then each dependency after a line of 80 '=' and `MSG: pkg/Type`), message encoding `cdr`,
  channel metadata `offered_qos_profiles` (a YAML string) and, from Jazzy, `topic_type_hash`,
  and a metadata record `rosbag2` holding the serialized metadata. Chunks are uncompressed by
  default; the storage presets give `zstd_fast` / `zstd_small` (zstd chunks) and `fastwrite`
  (no chunks at all); a storage config can ask for lz4 chunks.
- `--compression-mode file --compression-format zstd` compresses each finished file into
  `<file>.zstd` and lists that name; `message` mode (SQLite3 only) compresses each message.
- `--max-bag-size` / `--max-bag-duration` split the recording into `<name>_0`, `<name>_1`, ...
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

INFINITE = {"sec": 9223372036, "nsec": 854775807}  # RMW_DURATION_INFINITE as rosbag2 prints it
RULE = "=" * 80


def _dump(data) -> str:
    import io

    from ruamel.yaml import YAML

    out = io.StringIO()
    writer = YAML()
    writer.default_flow_style = False
    writer.dump(data, out)
    return out.getvalue()


def qos_profiles(version: int) -> list[dict]:
    """The offered QoS of a camera driver's publisher as rosbag2 records it (reliable,
    volatile, depth 0 / history unknown as reported by the middleware)."""
    named = version >= 9
    return [{"history": "unknown" if named else 3, "depth": 0,
             "reliability": "reliable" if named else 1,
             "durability": "volatile" if named else 2,
             "deadline": dict(INFINITE), "lifespan": dict(INFINITE),
             "liveliness": "automatic" if named else 1,
             "liveliness_lease_duration": dict(INFINITE),
             "avoid_ros_namespace_conventions": False}]


def qos_string(version: int) -> str:
    """The QoS list as the YAML string the topics table / channel metadata hold."""
    return _dump(qos_profiles(version)).rstrip("\n")


def ros2msg(store, typename: str) -> str:
    """A type's `ros2msg` text as rosbag2 stores it: the .msg file as installed (comments and
    constants kept), then every dependency after the 80-'=' rule and `MSG: pkg/Type`."""
    text, _ = store.generate_msgdef(typename, ros_version=2)
    parts = text.split(RULE + "\n")
    commented = [f"# {typename.rsplit('/', 1)[-1]}: as installed, with comments\n"
                 "# (rosbag2 copies the .msg file verbatim)\n\n" + parts[0]]
    for part in parts[1:]:                  # "MSG: pkg/Type", then the fields, commented
        head, _, fields = part.partition("\n")
        commented.append(f"{head}\n# {head[5:]}\n" + fields.replace("\n", "  # a field\n", 1))
    return ("\n" + RULE + "\n").join(p.rstrip("\n") for p in commented) + "\n"


@dataclass
class Topic:
    name: str
    msgtype: str
    messages: list[tuple[int, bytes]]          # (log time ns, CDR bytes)


@dataclass
class Recording:
    """What one `ros2 bag record` session saw, laid out per distro and storage."""

    topics: list[Topic]
    distro: str = "jazzy"                        # humble | iron | jazzy
    files: list[list[tuple[int, int, bytes]]] = field(default_factory=list)

    @property
    def version(self) -> int:
        return {"humble": 5, "iron": 7, "jazzy": 9}[self.distro]

    def split(self, parts: int) -> list[list[tuple[int, int, bytes]]]:
        """(topic index, log time, data) in log-time order, cut into `parts` files."""
        rows = sorted(((i, t, d) for i, topic in enumerate(self.topics)
                       for t, d in topic.messages), key=lambda r: r[1])
        size = -(-len(rows) // parts)
        return [rows[k * size:(k + 1) * size] for k in range(parts)]


def metadata_yaml(rec: Recording, storage: str, files: list[str], per_file, store,
                  compression: str = "") -> str:
    """metadata.yaml text as rosbag2's SequentialWriter writes it when the recording stops."""
    version = rec.version
    rows = [r for part in per_file for r in part]
    start = min(t for _, t, _ in rows)
    end = max(t for _, t, _ in rows)
    topics = []
    for i, topic in enumerate(rec.topics):
        meta = {"name": topic.name, "type": topic.msgtype, "serialization_format": "cdr",
                "offered_qos_profiles": qos_profiles(version) if version >= 9
                else qos_string(version)}
        if version >= 7:
            meta["type_description_hash"] = store.hash_rihs01(topic.msgtype)
        topics.append({"topic_metadata": meta,
                       "message_count": sum(1 for j, _, _ in rows if j == i)})
    info = {"version": version, "storage_identifier": storage,
            "duration": {"nanoseconds": end - start},
            "starting_time": {"nanoseconds_since_epoch": start},
            "message_count": len(rows), "topics_with_message_count": topics,
            "compression_format": "zstd" if compression else "",
            "compression_mode": compression.upper(),
            "relative_file_paths": files,
            "files": [{"path": name,
                       "starting_time": {"nanoseconds_since_epoch": min(t for _, t, _ in part)},
                       "duration": {"nanoseconds": max(t for _, t, _ in part)
                                    - min(t for _, t, _ in part)},
                       "message_count": len(part)} for name, part in zip(files, per_file, strict=True)]}
    if version >= 6:
        info["custom_data"] = None               # yaml-cpp prints an empty map as `~`
    if version >= 8:
        info["ros_distro"] = rec.distro
    text = _dump({"rosbag2_bagfile_information": info})
    return text.replace("custom_data: null", "custom_data: ~")


def write_db3(path: Path, rec: Recording, rows, store, wal_tail: int = 0,
              message_compression: bool = False) -> Path:
    """One .db3 file with the distro's schema. `wal_tail` > 0 records with the `resilient`
    preset (WAL journal) and leaves the last `wal_tail` messages only in the -wal file, as a
    recording killed before SQLite checkpointed them does."""
    schema = 4 if rec.distro == "jazzy" else 3
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=" + ("WAL" if wal_tail else "MEMORY"))
    con.execute("PRAGMA wal_autocheckpoint=0")
    con.executescript(
        "CREATE TABLE schema(schema_version INTEGER PRIMARY KEY, ros_distro TEXT NOT NULL);"
        "CREATE TABLE metadata(id INTEGER PRIMARY KEY, metadata_version INTEGER NOT NULL,"
        " metadata TEXT NOT NULL);"
        "CREATE TABLE topics(id INTEGER PRIMARY KEY, name TEXT NOT NULL, type TEXT NOT NULL,"
        " serialization_format TEXT NOT NULL, offered_qos_profiles TEXT NOT NULL"
        + (", type_description_hash TEXT NOT NULL);" if schema >= 4 else ");")
        + ("CREATE TABLE message_definitions(id INTEGER PRIMARY KEY, topic_type TEXT NOT NULL,"
           " encoding TEXT NOT NULL, encoded_message_definition TEXT NOT NULL,"
           " type_description_hash TEXT NOT NULL);" if schema >= 4 else "")
        + "CREATE TABLE messages(id INTEGER PRIMARY KEY, topic_id INTEGER NOT NULL,"
        " timestamp INTEGER NOT NULL, data BLOB NOT NULL);"
        "CREATE INDEX timestamp_idx ON messages (timestamp ASC);")
    con.execute("INSERT INTO schema (schema_version, ros_distro) VALUES (?, ?)",
                (schema, rec.distro))
    for i, topic in enumerate(rec.topics, start=1):
        values = [i, topic.name, topic.msgtype, "cdr", qos_string(rec.version)]
        if schema >= 4:
            values.append(store.hash_rihs01(topic.msgtype))
            con.execute("INSERT INTO message_definitions (topic_type, encoding, "
                        "encoded_message_definition, type_description_hash) VALUES (?,?,?,?)",
                        (topic.msgtype, "ros2msg", ros2msg(store, topic.msgtype),
                         store.hash_rihs01(topic.msgtype)))
        con.execute(f"INSERT INTO topics VALUES ({','.join('?' * len(values))})", values)
    con.commit()
    if wal_tail:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    head = rows[: len(rows) - wal_tail] if wal_tail else rows
    _insert(con, head, message_compression)
    if wal_tail:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _insert(con, rows[len(head):], message_compression)
        _abandon(con, path)
    else:
        con.close()
    return path


def _insert(con, rows, message_compression: bool) -> None:
    if message_compression:
        import zstandard

        compressor = zstandard.ZstdCompressor()
    for topic_index, log_time, data in rows:
        if message_compression:
            data = compressor.compress(data)
        con.execute("INSERT INTO messages (timestamp, topic_id, data) VALUES (?, ?, ?)",
                    (log_time, topic_index + 1, data))
    con.commit()


def _abandon(con, path: Path) -> None:
    """Leave the -wal file as a killed process does: copy the files while the connection is
    still open (closing would checkpoint the WAL into the database and delete it)."""
    keep = {p: p.read_bytes() for p in path.parent.glob(path.name + "*")}
    con.close()
    for p, data in keep.items():
        p.write_bytes(data)
    assert Path(str(path) + "-wal").stat().st_size > 0


def write_mcap(path: Path, rec: Recording, rows, store, preset: str = "none",
               finish: bool = True, definitions: bool = True) -> Path:
    """One .mcap file as rosbag2's MCAP storage plugin writes it with `preset` (none,
    zstd_fast, zstd_small, fastwrite, or lz4 from a storage config). `finish=False` stops
    before the summary and footer, as a killed recording does; `definitions=False` writes the
    schemas rosbag2 writes when it finds no definition on the recording machine (encoding
    `unknown`, empty text)."""
    from mcap.writer import CompressionType, Writer

    compression = {"none": CompressionType.NONE, "fastwrite": CompressionType.NONE,
                   "zstd_fast": CompressionType.ZSTD, "zstd_small": CompressionType.ZSTD,
                   "lz4": CompressionType.LZ4}[preset]
    chunk = 4 * 1024 * 1024 if preset == "zstd_small" else 768 * 1024
    fh = path.open("wb")
    writer = Writer(fh, chunk_size=chunk, compression=compression,
                    use_chunking=preset != "fastwrite", enable_crcs=True)
    writer.start(profile="ros2", library=f"rosbag2.{rec.distro}.mcap.v0.15.0")
    schemas, channels = {}, {}
    for i, topic in enumerate(rec.topics):
        if topic.msgtype not in schemas:
            schemas[topic.msgtype] = writer.register_schema(
                topic.msgtype, "ros2msg", ros2msg(store, topic.msgtype).encode()) \
                if definitions else writer.register_schema(topic.msgtype, "unknown", b"")
        metadata = {"offered_qos_profiles": qos_string(rec.version)}
        if rec.version >= 7:
            metadata["topic_type_hash"] = store.hash_rihs01(topic.msgtype)
        channels[i] = writer.register_channel(topic.name, "cdr", schemas[topic.msgtype], metadata)
    for seq, (topic_index, log_time, data) in enumerate(rows):
        writer.add_message(channels[topic_index], log_time, data, publish_time=log_time,
                           sequence=seq)
    if finish:
        if rec.version >= 9:
            writer.add_metadata("rosbag2", {"serialized_metadata": "version: 9\n"})
        writer.finish()
        fh.close()
    else:
        # the chunk being filled is in the writer's memory; what reached the disk stops there
        fh.flush()
        fh.close()
    return path


def record(directory: Path, rec: Recording, store, storage: str = "mcap", preset: str = "none",
           parts: int = 1, compression: str = "", killed: bool = False,
           wal_tail: int = 0, definitions: bool = True) -> Path:
    """A rosbag2 directory `directory` (its name is the bag's name, as `ros2 bag record -o`)."""
    import zstandard

    directory.mkdir(parents=True)
    per_file = rec.split(parts)
    suffix = ".mcap" if storage == "mcap" else ".db3"
    names = []
    for k, rows in enumerate(per_file):
        path = directory / f"{directory.name}_{k}{suffix}"
        last = k == len(per_file) - 1
        if storage == "mcap":
            write_mcap(path, rec, rows, store, preset, finish=not (killed and last),
                       definitions=definitions)
        else:
            write_db3(path, rec, rows, store, wal_tail=wal_tail if last else 0,
                      message_compression=compression == "message")
        if compression == "file" and not (killed and last):
            packed = path.with_name(path.name + ".zstd")
            packed.write_bytes(zstandard.ZstdCompressor().compress(path.read_bytes()))
            path.unlink()
            path = packed
        names.append(path.name)
    if not killed:
        (directory / "metadata.yaml").write_text(
            metadata_yaml(rec, storage, names, per_file, store, compression))
    return directory
