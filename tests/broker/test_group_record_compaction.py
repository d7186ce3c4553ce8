"""Classic group records in the compacted ``__consumer_offsets`` (issue 24): the log cleaner
keeps the latest GroupMetadataValue of each group (its key, version 2 and the group id, is
not an offset commit's), a group's tombstone removes it, and a kill -9 restart loads the
latest generation."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.join_group.v3.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.leave_group.v1.request import LeaveGroupRequest
from kio.schema.sync_group.v2.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.schema.types import GroupId
from kio.static.primitive import i32, i32Timedelta

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.broker.log_cleaner import CHECKPOINT_FILE, read_checkpoints
from onceflow.groups.group_metadata_record import decode_group_metadata_value
from onceflow.groups.offsets_record import GroupMetadataKey, decode_key
from onceflow.log.segment import LOG_SUFFIX
from onceflow.protocol.client import BrokerConnection
from onceflow.records.record import iter_decoded_batches
from onceflow.txn.coordinator import OFFSETS_TOPIC
from tests.admin_requests import call, connect
from tests.confluent import QUIET
from tests.waiting import wait_for

# Small segments of the offsets log, and a cleaner that cleans them at once.
SETTINGS = {
    "offsets.topic.segment.bytes": "4096",
    "log.cleaner.backoff.ms": "50",
    "log.cleaner.min.cleanable.ratio": "0.01",
    "group.initial.rebalance.delay.ms": "0",
}
OFFSETS_DIR = f"{OFFSETS_TOPIC}-0"
TIMEOUT = i32Timedelta.parse(datetime.timedelta(seconds=60))
ROUNDS = 40  # two records each: about 20 segments of 4 KiB


def generation(connection: BrokerConnection, group: str, *, leave: bool) -> tuple[str, int]:
    """One member joins `group`, assigns itself, and (with `leave`) leaves: the group's
    record is written at the SyncGroup and, once it has left, when the group ends empty."""
    joined = connection.send(
        JoinGroupRequest(
            group_id=GroupId(group),
            session_timeout=TIMEOUT,
            rebalance_timeout=TIMEOUT,
            member_id="",
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"subscription"),),
        )
    )
    assert joined.error_code is ErrorCode.none
    synced = connection.send(
        SyncGroupRequest(
            group_id=GroupId(group),
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            assignments=(SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"a"),),
        )
    )
    assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"a")
    if leave:
        left = connection.send(
            LeaveGroupRequest(group_id=GroupId(group), member_id=joined.member_id)
        )
        assert left.error_code is ErrorCode.none
    return joined.member_id, joined.generation_id


def checkpoint(data_dir: Path) -> int:
    """The offsets log's clean point, as the cleaner's checkpoint file says."""
    return read_checkpoints(data_dir / CHECKPOINT_FILE).get((OFFSETS_TOPIC, 0), 0)


def group_records(directory: Path, group: str, below: int | None = None) -> list[int]:
    """The generations of `group`'s records in the log's segment files, read offline."""
    found = []
    for path in sorted(directory.glob(f"*{LOG_SUFFIX}")):
        for batch in iter_decoded_batches(path.read_bytes()):
            if batch.header.is_control:
                continue
            for offset, record in enumerate(batch.records, batch.header.base_offset):
                if below is not None and offset >= below:
                    continue
                key = decode_key(record.key or b"")
                if key == GroupMetadataKey(group):
                    value = record.value
                    found.append(
                        -1 if value is None else decode_group_metadata_value(value).generation
                    )
    return found


def describe(bootstrap: str, group: str) -> tuple[str, list[str]]:
    request = DescribeGroupsRequest(groups=(GroupId(group),), include_authorized_operations=False)
    [described] = call(bootstrap, request).groups
    return described.group_state, [m.member_id for m in described.members]


def test_the_cleaner_keeps_the_latest_group_record_and_a_restart_loads_it(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = make_broker(data, settings=SETTINGS)
    with connect(broker.bootstrap) as connection:
        for _ in range(ROUNDS):
            generation(connection, "kept", leave=True)
        generation(connection, "deleted", leave=True)
        member_id, last_generation = generation(connection, "kept", leave=False)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, **QUIET})
    admin.delete_consumer_groups(["deleted"], request_timeout=30)["deleted"].result(30)
    written = last_generation  # one record per generation: 1, 2, ... the last
    assert written == 2 * ROUNDS + 1
    # Everything but the active segment (a dozen records at 4 KiB) gets cleaned.
    wait_for(lambda: checkpoint(data) >= written - 20, what="the offsets log cleaned")
    broker.kill()

    clean_point = checkpoint(data)
    below = group_records(data / OFFSETS_DIR, "kept", clean_point)
    assert len(below) <= 1, f"{below}: the group's records below the clean point"
    kept = group_records(data / OFFSETS_DIR, "kept")
    assert len(kept) < written / 2 and kept == sorted(kept) and kept[-1] == last_generation

    broker.restart()
    assert describe(broker.bootstrap, "kept") == ("Stable", [member_id])
    heartbeat = HeartbeatRequest(
        group_id=GroupId("kept"), generation_id=i32(last_generation), member_id=member_id
    )
    assert call(broker.bootstrap, heartbeat).error_code is ErrorCode.none
    assert describe(broker.bootstrap, "deleted") == ("Dead", [])
