"""rosbag2 bags without rosbag2: what bag_player, bag_recorder and the tests share.

Built on `rosbags` (pure Python; reads and writes real rosbag2 bags, sqlite3 and MCAP).
No rclpy at import: everything here works in a plain Python with rosbags installed; the
one helper that takes rclpy messages imports rclpy only when handed one.

* make_typestore(): the ROS 2 Kilted types plus this package's custom messages, registered
  from their .msg text (the source tree's msg/ or an install's share/robotserve_ros/msg),
  so rosbags can (de)serialize ExecutionProgress & co. and write their definitions and
  RIHS01 hashes into a bag (they match what rclpy's generated types announce).
* register_types(): any other custom type found as <prefix>/share/<pkg>/msg/<Type>.msg.
* write_bag(path, messages) / read_bag(path): whole bags in one call, for tests and tools.
* open_bag(): a rosbags Reader with errors that name the path (BagError).
* restamp_cdr(): set the header stamp of a CDR-serialized message whose first field is a
  std_msgs/Header, without deserializing it.

Message type names are the rosbag2 / rosbags form "pkg/msg/Type" ("pkg/Type" is accepted
where a name is taken).
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Tuple

PACKAGE = "robotserve_ros"
STORAGES = ("mcap", "sqlite3")
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"
JOINT_STATE = "sensor_msgs/msg/JointState"
#: What bag_player plays when no topics are named.
DEFAULT_PLAY_TYPES = (IMAGE, JOINT_STATE)
#: Topics of these types are published / subscribed with sensor-data QoS (best effort).
SENSOR_TYPES = frozenset({IMAGE, COMPRESSED_IMAGE, JOINT_STATE})


class BagError(Exception):
    """A bag that cannot be opened, read or written; the message names the path."""


class BagMessage(NamedTuple):
    topic: str
    msgtype: str
    timestamp: int  # ns, the bag's receive time
    data: Any       # CDR bytes (raw=True) or a rosbags message object


# ----------------------------------------------------------------------------------------
# Type names and .msg files
# ----------------------------------------------------------------------------------------
def normalize_msgtype(name: str) -> str:
    """"pkg/Type" or "pkg/msg/Type" -> "pkg/msg/Type"."""
    parts = name.strip("/").split("/")
    if len(parts) == 2:
        return f"{parts[0]}/msg/{parts[1]}"
    if len(parts) == 3 and parts[1] == "msg":
        return "/".join(parts)
    raise ValueError(f"not a message type name: {name!r} (expected pkg/msg/Type)")


def msgtype_of(msg: Any) -> str:
    """The "pkg/msg/Type" of a rosbags message object or an rclpy-generated message."""
    t = getattr(msg, "__msgtype__", None)
    if isinstance(t, str):
        return t
    cls = type(msg)
    pkg, sub = cls.__module__.split(".")[:2]  # e.g. sensor_msgs.msg._image
    if sub != "msg":
        raise ValueError(f"cannot tell the message type of {cls!r}")
    return f"{pkg}/msg/{cls.__name__}"


def msg_dirs(package: str) -> List[Path]:
    """Where <package>'s .msg files may be, best first: for this package the source tree's
    msg/ directory; then <prefix>/share/<package>/msg for every AMENT_PREFIX_PATH entry
    and sys.prefix (a venv the wheels or the Makefile installed into)."""
    found: List[Path] = []
    if package == PACKAGE:
        found.append(Path(__file__).resolve().parent.parent / "msg")
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes.append(sys.prefix)
    for prefix in prefixes:
        found.append(Path(prefix) / "share" / package / "msg")
    out: List[Path] = []
    for d in found:
        if d.is_dir() and d not in out:
            out.append(d)
    return out


def find_msg_file(msgtype: str) -> Optional[Path]:
    pkg, _, name = normalize_msgtype(msgtype).split("/")
    for d in msg_dirs(pkg):
        f = d / f"{name}.msg"
        if f.is_file():
            return f
    return None


def _referenced(desc: Any) -> Iterator[str]:
    """Type names a rosbags field description refers to (nested in arrays/sequences)."""
    if isinstance(desc, str):
        if "/msg/" in desc:
            yield desc
    elif isinstance(desc, (tuple, list)):
        for x in desc:
            yield from _referenced(x)


def register_types(typestore, msgtypes: Iterable[str]) -> List[str]:
    """Register the given types (and the types they use) that `typestore` lacks, from their
    .msg files (find_msg_file). Returns the names that could not be found; if any is
    missing nothing is registered."""
    from rosbags.typesys import get_types_from_msg

    pending = [normalize_msgtype(t) for t in msgtypes]
    parsed: Dict[str, Any] = {}
    missing: List[str] = []
    while pending:
        t = pending.pop()
        if t in typestore.fielddefs or t in parsed or t in missing:
            continue
        f = find_msg_file(t)
        if f is None:
            missing.append(t)
            continue
        typs = get_types_from_msg(f.read_text(), t)
        parsed.update(typs)
        for _, fields in typs.values():
            for _, desc in fields:
                pending.extend(r for r in _referenced(desc) if r not in typestore.fielddefs)
    if parsed and not missing:
        typestore.register(parsed)
    return missing


def package_msgtypes(package: str = PACKAGE) -> List[str]:
    """Every message type whose .msg file the package has (first directory that has any)."""
    for d in msg_dirs(package):
        names = sorted(p.stem for p in d.glob("*.msg"))
        if names:
            return [f"{package}/msg/{n}" for n in names]
    return []


def make_typestore(extra: Iterable[str] = ()):
    """A rosbags typestore of ROS 2 Kilted with this package's messages (and `extra` types,
    found by register_types) registered. Raises BagError if this package's .msg files
    cannot be found or an extra type is missing."""
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    own = package_msgtypes(PACKAGE)
    if not own:
        raise BagError(f"no .msg files of {PACKAGE} found (looked in the source tree's msg/ and "
                       f"<prefix>/share/{PACKAGE}/msg for AMENT_PREFIX_PATH and {sys.prefix})")
    missing = register_types(ts, list(own) + list(extra))
    if missing:
        raise BagError(f"message types not found: {', '.join(missing)}")
    return ts


def register_from_connections(typestore, connections) -> None:
    """Register the types a bag carries its own definitions of (rosbag2 stores each
    connection's full .msg text), so a bag reads back without the .msg files."""
    from rosbags.interfaces import MessageDefinitionFormat
    from rosbags.typesys import get_types_from_idl, get_types_from_msg

    typs: Dict[str, Any] = {}
    for c in connections:
        if c.msgtype in typestore.fielddefs or c.msgdef.format == MessageDefinitionFormat.NONE:
            continue
        if c.msgdef.format == MessageDefinitionFormat.MSG:
            typs.update(get_types_from_msg(c.msgdef.data, c.msgtype))
        else:
            sep = "=" * 80 + "\n"
            for part in c.msgdef.data.split(sep)[1:] if c.msgdef.data.startswith(f"{sep}IDL: ") else [c.msgdef.data]:
                typs.update(get_types_from_idl(part.split("\n", 1)[1] if part.startswith("IDL: ") else part))
    if typs:
        typestore.register(typs)


# ----------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------
def open_bag(path: os.PathLike | str):
    """An open rosbags Reader for a rosbag2 directory (metadata.yaml + .db3/.mcap files) or
    a single .mcap/.db3 file. Raises BagError naming the path. Close it when done."""
    from rosbags.rosbag2 import Reader

    p = Path(path)
    if not str(path):
        raise BagError("no bag path given")
    if not p.exists():
        raise BagError(f"{p}: no such file or directory")
    if p.is_dir() and not (p / "metadata.yaml").is_file():
        raise BagError(f"{p}: not a rosbag2 bag directory (no metadata.yaml)")
    if p.is_file() and p.suffix not in (".mcap", ".db3"):
        raise BagError(f"{p}: not a bag (expected a bag directory, a .mcap or a .db3 file)")
    try:
        reader = Reader(p)
        reader.open()
    except Exception as e:  # ReaderError, yaml, sqlite3, OSError ...
        raise BagError(f"{p}: cannot read the bag: {e}") from e
    return reader


def bag_topics(path: os.PathLike | str) -> Dict[str, Tuple[str, int]]:
    """topic -> (msgtype, message count) of a bag."""
    reader = open_bag(path)
    try:
        return {t: (info.msgtype, info.msgcount) for t, info in reader.topics.items()}
    finally:
        reader.close()


def iter_bag(path: os.PathLike | str, topics: Optional[Iterable[str]] = None, *, typestore=None,
             raw: bool = False) -> Iterator[BagMessage]:
    """The bag's messages in time order (of the topics named, default all), deserialized
    with `typestore` (default make_typestore(), plus the definitions the bag carries), or
    as CDR bytes with raw=True. The bag is opened (BagError) before this returns."""
    reader = open_bag(path)
    try:
        wanted = None if topics is None else set(topics)
        conns = [c for c in reader.connections if wanted is None or c.topic in wanted]
        if not raw:
            if typestore is None:
                typestore = make_typestore()
            register_from_connections(typestore, conns)
    except BaseException:
        reader.close()
        raise
    return _messages(reader, conns, typestore, raw)


def _messages(reader, conns, typestore, raw: bool) -> Iterator[BagMessage]:
    try:
        for conn, ts, data in reader.messages(connections=conns) if conns else ():
            yield BagMessage(conn.topic, conn.msgtype, ts,
                             bytes(data) if raw else typestore.deserialize_cdr(data, conn.msgtype))
    finally:
        reader.close()


def read_bag(path: os.PathLike | str, topics: Optional[Iterable[str]] = None, *, typestore=None,
             raw: bool = False) -> List[BagMessage]:
    """All of iter_bag() as a list."""
    return list(iter_bag(path, topics, typestore=typestore, raw=raw))


# ----------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------
def storage_plugin(storage: str):
    from rosbags.rosbag2 import StoragePlugin

    try:
        return {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}[storage]
    except KeyError:
        raise BagError(f"unknown storage {storage!r}: one of {', '.join(STORAGES)}") from None


def open_writer(path: os.PathLike | str, storage: str = "mcap"):
    """An open rosbags Writer creating the bag directory `path` (format version 9).
    Refuses an existing path. Raises BagError naming the path."""
    from rosbags.rosbag2 import Writer

    p = Path(path)
    if p.exists():
        raise BagError(f"{p} exists already; not overwriting it (give a new path)")
    try:
        w = Writer(p, version=Writer.VERSION_LATEST, storage_plugin=storage_plugin(storage))
        w.open()
    except BagError:
        raise
    except Exception as e:
        raise BagError(f"{p}: cannot create the bag: {e}") from e
    return w


def to_cdr(msg: Any, msgtype: str, typestore) -> bytes:
    """CDR bytes of bytes (as they are), a rosbags message, or an rclpy message."""
    if isinstance(msg, (bytes, bytearray, memoryview)):
        return bytes(msg)
    if hasattr(msg, "__msgtype__"):
        return bytes(typestore.serialize_cdr(msg, msgtype))
    from rclpy.serialization import serialize_message  # an rclpy message

    return serialize_message(msg)


def write_bag(path: os.PathLike | str, messages: Iterable[Tuple[str, int, Any]], *, storage: str = "mcap",
              typestore=None, msgtypes: Optional[Mapping[str, str]] = None) -> Path:
    """Write a new bag directory: `messages` are (topic, timestamp_ns, msg) with msg a
    rosbags message, an rclpy message, or CDR bytes (then `msgtypes[topic]` names its type;
    it may also override a message's own). Returns the path.

        write_bag(tmp / "b", [("/joint_states", t_ns, JointState(...)), ...], storage="sqlite3")
    """
    ts = typestore if typestore is not None else make_typestore()
    msgtypes = {k: normalize_msgtype(v) for k, v in (msgtypes or {}).items()}
    w = open_writer(path, storage)
    conns: Dict[str, Any] = {}
    try:
        for topic, stamp, msg in messages:
            conn = conns.get(topic)
            if conn is None:
                mt = msgtypes.get(topic) or msgtype_of(msg)
                if mt not in ts.fielddefs and register_types(ts, [mt]):
                    raise BagError(f"{path}: message type {mt} of {topic} is unknown (no .msg found)")
                conn = conns[topic] = w.add_connection(topic, mt, typestore=ts)
            w.write(conn, int(stamp), to_cdr(msg, conn.msgtype, ts))
    finally:
        w.close()
    return Path(path)


# ----------------------------------------------------------------------------------------
# Header stamps in CDR
# ----------------------------------------------------------------------------------------
_STAMP = {0: struct.Struct(">iI"), 1: struct.Struct("<iI")}  # CDR big / little endian


def restamp_cdr(data: bytes, stamp_ns: int) -> bytes:
    """`data` (a CDR-serialized message whose first field is a std_msgs/Header) with its
    header.stamp set to `stamp_ns`. The stamp is the first thing after the 4-byte
    encapsulation header: int32 sec, uint32 nanosec, in the byte order it names."""
    if len(data) < 12 or data[0] != 0 or data[1] not in _STAMP:
        raise ValueError("not a plain-CDR message")
    out = bytearray(data)
    sec, nsec = divmod(int(stamp_ns), 1_000_000_000)
    _STAMP[data[1]].pack_into(out, 4, sec, nsec)
    return bytes(out)


def cdr_stamp_ns(data: bytes) -> int:
    """The header.stamp (ns) of a CDR message whose first field is a std_msgs/Header."""
    sec, nsec = _STAMP[data[1]].unpack_from(data, 4)
    return sec * 1_000_000_000 + nsec
