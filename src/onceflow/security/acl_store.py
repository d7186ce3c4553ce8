"""The ACLs, durable in the data directory (`acls.json`, replaced atomically and fsynced by
durable_file.py, so a kill -9 leaves the old set or the new one).

The file is small and read whole at start. A change computes the new set, writes it (off the
event loop in the broker), and only then is it served, so what a client was told is on disk.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from onceflow.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    PatternType,
    PermissionType,
    ResourcePattern,
    ResourceType,
)
from onceflow.security.acl_index import sort_key
from onceflow.security.durable_file import (
    DurableFileError,
    load_json_store,
    write_json_atomically,
)

ACLS_FILE = "acls.json"
FORMAT_VERSION = 1


class AclStoreError(Exception):
    """The ACL file cannot be read or written; one line for the operator."""


def load_acls(data_dir: Path) -> frozenset[AclBinding]:
    return load_json_store(
        data_dir / ACLS_FILE,
        lambda raw: frozenset(_decode(item) for item in raw.get("acls", [])),
        AclStoreError,
    )


def store_acls(data_dir: Path, acls: Iterable[AclBinding]) -> None:
    """Blocking (fsync): a worker thread in the broker."""
    payload = {"version": FORMAT_VERSION, "acls": [_encode(b) for b in sorted(acls, key=sort_key)]}
    try:
        write_json_atomically(data_dir / ACLS_FILE, payload, mode=0o644)
    except DurableFileError as e:
        raise AclStoreError(str(e)) from e


def _encode(binding: AclBinding) -> dict[str, Any]:
    pattern, entry = binding.pattern, binding.entry
    return {
        "resource_type": pattern.resource_type.name,
        "name": pattern.name,
        "pattern_type": pattern.pattern_type.name,
        "principal": entry.principal,
        "host": entry.host,
        "operation": entry.operation.name,
        "permission_type": entry.permission_type.name,
    }


def _decode(raw: dict[str, Any]) -> AclBinding:
    binding = AclBinding(
        ResourcePattern(
            ResourceType[raw["resource_type"]], raw["name"], PatternType[raw["pattern_type"]]
        ),
        AccessControlEntry(
            raw["principal"],
            raw["host"],
            AclOperation[raw["operation"]],
            PermissionType[raw["permission_type"]],
        ),
    )
    binding.validate()
    return binding
