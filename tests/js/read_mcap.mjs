// Reads an MCAP log with the libraries Foxglove's app is built on, so that tests can see what a
// Foxglove user would see (tests/test_ros_foxglove.py runs it):
//
//   node read_mcap.mjs LOG.mcap
//     The file is opened as Foxglove opens a local file: @mcap/core's indexed reader over a file
//     handle (summary, chunk indexes, zstd / lz4 chunks), falling back to the stream reader for a
//     file without an index. Each channel's `ros2msg` schema is parsed by @foxglove/rosmsg
//     (ros2 mode) and each CDR message decoded by @foxglove/rosmsg2-serialization. Prints JSON
//     lines: one {"kind": "file"}, one {"kind": "channel"} per channel (with the parsed
//     definitions), then one {"kind": "message"} per message in log-time order.
//
//   node read_mcap.mjs --foxglove-ros2 NAME...
//     The ROS 2 definition of each Foxglove schema NAME (e.g. ImageAnnotations) from
//     @foxglove/schemas, parsed by @foxglove/rosmsg the same way, one JSON line each.
//
// JSON has no 64-bit integers or bytes: times are decimal strings of nanoseconds, uint8 arrays are
// {"base64": ...}, other typed arrays plain arrays, maps objects. Exit 1 with a one-line error on stderr.

import { open } from "node:fs/promises";

import { parse } from "@foxglove/rosmsg";
import { MessageReader } from "@foxglove/rosmsg2-serialization";
import lz4 from "@foxglove/wasm-lz4";
import zstd from "@foxglove/wasm-zstd";
import { McapIndexedReader, McapStreamReader } from "@mcap/core";
import { FileHandleReadable } from "@mcap/nodejs";

function toJson(value) {
  if (typeof value === "bigint") {
    return value.toString();
  }
  if (value instanceof Uint8Array) {
    return { base64: Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("base64") };
  }
  if (value instanceof Map) {
    return Object.fromEntries(Array.from(value, ([k, v]) => [String(k), toJson(v)]));
  }
  if (ArrayBuffer.isView(value)) {
    return Array.from(value, toJson);
  }
  if (Array.isArray(value)) {
    return value.map(toJson);
  }
  if (value !== null && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, toJson(v)]));
  }
  return value;
}

function emit(record) {
  process.stdout.write(JSON.stringify(toJson(record)) + "\n");
}

// The parsed form tests compare: per type, its fields with name, type, array and constant flags.
function describe(definitions) {
  return definitions.map((def) => ({
    name: def.name ?? null,
    fields: def.definitions.map((f) => ({
      name: f.name,
      type: f.type,
      isArray: Boolean(f.isArray),
      isComplex: Boolean(f.isComplex),
      ...(f.isConstant ? { isConstant: true, value: f.value } : {}),
      ...(f.arrayLength !== undefined ? { arrayLength: f.arrayLength } : {}),
    })),
  }));
}

async function decompressHandlers() {
  await zstd.isLoaded;
  await lz4.isLoaded;
  return {
    zstd: (data, size) => zstd.decompress(data, Number(size)),
    lz4: (data, size) => lz4(data, Number(size)),
  };
}

// Foxglove decodes a ROS 2 channel only when its messages are CDR and its schema ros2msg text.
function channelDecoder(channel, schema) {
  if (channel.messageEncoding !== "cdr") {
    throw new Error(`channel ${channel.topic}: message encoding ${channel.messageEncoding}, not cdr`);
  }
  if (schema === undefined || schema.encoding !== "ros2msg") {
    throw new Error(`channel ${channel.topic}: schema encoding ${schema?.encoding}, not ros2msg`);
  }
  const definitions = parse(new TextDecoder().decode(schema.data), { ros2: true });
  return { definitions, reader: new MessageReader(definitions) };
}

async function* indexedMessages(reader) {
  for await (const message of reader.readMessages()) {
    yield message;
  }
}

async function* streamedRecords(handle, handlers) {
  const reader = new McapStreamReader({ decompressHandlers: handlers });
  reader.append(new Uint8Array(await handle.readFile()));
  for (let record; (record = reader.nextRecord()); ) {
    yield record;
  }
}

async function readLog(path) {
  const handle = await open(path, "r");
  try {
    const handlers = await decompressHandlers();
    let indexed;
    try {
      indexed = await McapIndexedReader.Initialize({
        readable: new FileHandleReadable(handle),
        decompressHandlers: handlers,
      });
    } catch (error) {
      emit({ kind: "file", reader: "stream", indexError: String(error.message ?? error) });
    }
    const decoders = new Map();
    const addChannel = (channel, schema) => {
      const decoder = channelDecoder(channel, schema);
      decoders.set(channel.id, { channel, schema, ...decoder });
      emit({
        kind: "channel",
        topic: channel.topic,
        // what the summary's statistics count for it (Foxglove's topic list, ros2 bag info)
        messageCount: indexed?.statistics?.channelMessageCounts.get(channel.id) ?? null,
        schemaName: schema.name,
        schemaEncoding: schema.encoding,
        messageEncoding: channel.messageEncoding,
        metadata: Object.fromEntries(channel.metadata),
        definitions: describe(decoder.definitions),
      });
    };
    const decode = (message) => {
      const { channel, schema, reader } = decoders.get(message.channelId);
      const decoded = reader.readMessage(message.data);
      emit({
        kind: "message",
        topic: channel.topic,
        schemaName: schema.name,
        logTime: message.logTime,
        publishTime: message.publishTime,
        sequence: message.sequence,
        trailingBytes: reader.lastReadHadTrailingBytes(),
        message: decoded,
      });
    };
    if (indexed !== undefined) {
      emit({ kind: "file", reader: "indexed", profile: indexed.header.profile,
             chunks: indexed.chunkIndexes.length, statistics: indexed.statistics ?? null });
      for (const channel of indexed.channelsById.values()) {
        addChannel(channel, indexed.schemasById.get(channel.schemaId));
      }
      for await (const message of indexedMessages(indexed)) {
        decode(message);
      }
      return;
    }
    const schemas = new Map();
    for await (const record of streamedRecords(handle, handlers)) {
      if (record.type === "Schema") {
        schemas.set(record.id, record);
      } else if (record.type === "Channel" && !decoders.has(record.id)) {
        addChannel(record, schemas.get(record.schemaId));
      } else if (record.type === "Message") {
        decode(record);
      }
    }
  } finally {
    await handle.close();
  }
}

async function foxgloveRos2(names) {
  const { foxgloveMessageSchemas, generateRosMsgMergedSchema } = await import(
    "@foxglove/schemas/internal.js"
  );
  for (const name of names) {
    const schema = foxgloveMessageSchemas[name];
    if (schema === undefined) {
      throw new Error(`@foxglove/schemas has no schema ${name}`);
    }
    const text = generateRosMsgMergedSchema(schema, { rosVersion: 2 });
    emit({ kind: "schema", name: `foxglove_msgs/msg/${name}`,
           definitions: describe(parse(text, { ros2: true })) });
  }
}

const args = process.argv.slice(2);
try {
  if (args.length >= 2 && args[0] === "--foxglove-ros2") {
    await foxgloveRos2(args.slice(1));
  } else if (args.length === 1) {
    await readLog(args[0]);
  } else {
    throw new Error("usage: read_mcap.mjs LOG.mcap | --foxglove-ros2 NAME...");
  }
} catch (error) {
  process.stderr.write(`read_mcap.mjs: ${String(error.message ?? error).split("\n")[0]}\n`);
  process.exit(1);
}
