"""The data directory's identity: `meta.properties`, as Kafka keeps it in every log directory.

A broker only ever works in a directory it created (or an earlier onceflow created): a new or
empty directory gets a `meta.properties` (version, cluster.id, node.id) before anything else is
written; a non-empty directory without one belongs to someone else, and the broker refuses to
start there rather than risk touching a user's files (Kafka refuses an unformatted log dir too).
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

META_PROPERTIES = "meta.properties"
_TMP = META_PROPERTIES + ".tmp"
VERSION = "1"


class DataDirError(Exception):
    """The data directory cannot be used; the message is one line for the operator."""


def open_data_dir(data_dir: Path, node_id: int) -> str:
    """Create or check the data directory; returns its cluster id."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / META_PROPERTIES
        if path.exists():
            return _check(path, data_dir, node_id)
        # A stale temporary file is ours (a crash while creating meta.properties).
        others = sorted(e.name for e in data_dir.iterdir() if e.name != _TMP)
    except NotADirectoryError:
        raise DataDirError(f"data directory {data_dir} is not a directory") from None
    except OSError as e:
        raise DataDirError(f"data directory {data_dir}: {e.strerror or e}") from None
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise DataDirError(
            f"data directory {data_dir} is not empty ({shown}) and has no {META_PROPERTIES}: "
            "it is not an onceflow data directory; give a new or empty directory"
        )
    cluster_id = new_cluster_id()
    _write(data_dir, {"version": VERSION, "cluster.id": cluster_id, "node.id": str(node_id)})
    return cluster_id


def new_cluster_id() -> str:
    """22 characters of URL-safe base64 of a random UUID, as Kafka's Uuid.toString()."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def read_properties(path: Path) -> dict[str, str]:
    props = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    return props


def _check(path: Path, data_dir: Path, node_id: int) -> str:
    props = read_properties(path)
    cluster_id = props.get("cluster.id", "")
    if not cluster_id:
        raise DataDirError(f"{path} has no cluster.id")
    stored = props.get("node.id")
    if stored is None:
        # Written by an onceflow before node.id was recorded: adopt the configured one.
        _write(data_dir, {**props, "node.id": str(node_id)})
    elif stored != str(node_id):
        raise DataDirError(
            f"{path} has node.id={stored} but the broker is configured with node.id={node_id}"
        )
    return cluster_id


def _write(data_dir: Path, props: dict[str, str]) -> None:
    """Atomically: a crash leaves the old file, or the new one, never half of one."""
    tmp = data_dir / _TMP
    with tmp.open("w") as f:
        f.write("".join(f"{k}={v}\n" for k, v in props.items()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, data_dir / META_PROPERTIES)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
