"""A classic group's record is byte-compatible with Apache Kafka's (issue 24): onceflow writes
exactly the bytes of Kafka 4.4's generated GroupMetadataValue v3, and reads every version
Kafka's class writes (0-4), each with its defaults for the fields it does not have."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from onceflow.apache_kafka import Distribution
from onceflow.groups.group_metadata_record import (
    GroupMetadataValue,
    MemberMetadata,
    decode_group_metadata_value,
    encode_group_metadata_value,
)

JAVA = Path(__file__).parent / "java"
# What GroupMetadataBytes.java writes.
VALUE = GroupMetadataValue(
    protocol_type="consumer",
    generation=7,
    protocol="range",
    leader="a-1",
    current_state_timestamp_ms=1_700_000_000_123,
    members=(
        MemberMetadata("a-1", None, "cli", "/127.0.0.1", 300_000, 45_000, b"sub", b"asg"),
        MemberMetadata("i-1", "inst", "cli2", "/::1", 60_000, 10_000, b"", b"\x00\x01"),
    ),
)


def as_of(version: int) -> GroupMetadataValue:
    """VALUE as a record of `version` holds it (the fields it lacks at their defaults)."""
    members = VALUE.members
    if version < 3:
        members = tuple(dataclasses.replace(m, group_instance_id=None) for m in members)
    if version < 1:
        members = tuple(dataclasses.replace(m, rebalance_timeout_ms=-1) for m in members)
    timestamp = VALUE.current_state_timestamp_ms if version >= 2 else -1
    return dataclasses.replace(VALUE, members=members, current_state_timestamp_ms=timestamp)


def test_group_metadata_value_matches_kafkas_bytes(apache_kafka: Distribution) -> None:
    command = apache_kafka.command(str(JAVA / "GroupMetadataBytes.java"), heap="64m")
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    kafka = {
        int(v): bytes.fromhex(h)
        for v, h in (line.split() for line in done.stdout.split("\n") if line)
    }
    assert sorted(kafka) == [0, 1, 2, 3, 4]
    assert encode_group_metadata_value(VALUE) == kafka[3]
    for version, raw in kafka.items():
        assert decode_group_metadata_value(raw) == as_of(version), f"version {version}"
