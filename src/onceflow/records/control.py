"""Transaction markers: the control batches that commit or abort a producer's transaction.

A marker is a batch with the transactional and control attributes, the producer's id and epoch,
base sequence -1 and one record: key = int16 version 0, int16 type (0 ABORT, 1 COMMIT);
value = int16 version 0, int32 coordinator epoch. Readers accept higher versions and read them
as version 0, as Kafka's ControlRecordType and EndTransactionMarker do.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from onceflow.records.batch import NO_PARTITION_LEADER_EPOCH, NO_SEQUENCE
from onceflow.records.builder import build_batch
from onceflow.records.errors import InvalidRecordError
from onceflow.records.record import Record


class ControlType(IntEnum):
    ABORT = 0
    COMMIT = 1


CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VERSION = 0
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def marker_key(control_type: ControlType) -> bytes:
    return _KEY.pack(CONTROL_KEY_VERSION, control_type)


def marker_value(coordinator_epoch: int) -> bytes:
    return _VALUE.pack(END_TXN_MARKER_VERSION, coordinator_epoch)


def build_marker(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """One COMMIT (commit=True) or ABORT marker batch for the producer's open transaction."""
    control_type = ControlType.COMMIT if commit else ControlType.ABORT
    record = (marker_key(control_type), marker_value(coordinator_epoch), (), timestamp_ms)
    return build_batch(
        [record],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        transactional=True,
        control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


def parse_control_type(record: Record) -> int:
    """The control type of a control record's key (any type, not only markers)."""
    return _unpack_versioned(_KEY, record.key, "control record key")


def parse_control_record(record: Record) -> tuple[ControlType, int]:
    """(COMMIT or ABORT, coordinator epoch) of a transaction marker record.

    InvalidRecordError when the record is not a well-formed marker (Kafka's other control
    types, such as KRaft's, included).
    """
    raw_type = parse_control_type(record)
    if raw_type not in (ControlType.ABORT, ControlType.COMMIT):
        raise InvalidRecordError(f"control type {raw_type} is not a transaction marker")
    coordinator_epoch = _unpack_versioned(_VALUE, record.value, "transaction marker value")
    return ControlType(raw_type), coordinator_epoch


def _unpack_versioned(layout: struct.Struct, data: bytes | None, what: str) -> int:
    """The field after the int16 version of a control record's key or value; a higher version
    reads as version 0 (its fields come first), a negative one is invalid."""
    if data is None or len(data) < layout.size:
        raise InvalidRecordError(f"{what} is shorter than {layout.size} bytes")
    version, field = layout.unpack_from(data)
    if version < 0:
        raise InvalidRecordError(f"invalid {what} version {version}")
    return int(field)
