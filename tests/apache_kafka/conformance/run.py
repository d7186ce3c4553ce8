"""A scenario's steps against one target, and the normalized transcript they leave.

Each step sends one request (at the version the suite fixes for its API) and records the
fields of the answer that two correct brokers must agree on. What legitimately differs is
normalized away: producer ids become P1, P2... in order of appearance and epochs are relative
to the first one seen of that producer; member ids become M1, M2...; group generations are
relative to the first; topic names and transactional ids are the scenario's own (each run
makes fresh ones, so offsets start at 0 on both brokers and are compared as they are);
throttle times, node ids, error messages and broker-chosen timestamps are dropped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from onceflow.records.control import parse_control_record
from onceflow.records.record import iter_decoded_batches
from tests.apache_kafka.conformance.target import UNSUPPORTED, Target
from tests.waiting import wait_for

# The API versions every scenario speaks: each broker supports them (onceflow and Kafka 4.4),
# and the transaction paths are the classic (v1) protocol's, which onceflow implements.
PRODUCE = (0, 9)
FETCH = (1, 12)
LIST_OFFSETS = (2, 7)
OFFSET_FETCH = (9, 7)
FIND_COORDINATOR = (10, 3)
JOIN_GROUP = (11, 6)
SYNC_GROUP = (14, 4)
DESCRIBE_GROUPS = (15, 5)
CREATE_TOPICS = (19, 5)
DELETE_RECORDS = (21, 2)
INIT_PRODUCER_ID = (22, 4)
ADD_PARTITIONS_TO_TXN = (24, 3)
ADD_OFFSETS_TO_TXN = (25, 3)
END_TXN = (26, 3)
TXN_OFFSET_COMMIT = (28, 3)
DESCRIBE_PRODUCERS = (61, 0)
DESCRIBE_TRANSACTIONS = (65, 0)
# KIP-848 consumer groups (Kafka 4.x finalizes group.version 1 by default).
METADATA = (3, 12)
OFFSET_COMMIT = (8, 9)
CONSUMER_GROUP_HEARTBEAT = (68, 1)
CONSUMER_GROUP_DESCRIBE = (69, 1)

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
EARLIEST = -2
LATEST = -1
MAX_TIMESTAMP = -3
# Record timestamps are a run's base plus what the scenario says. The base is an
# hour before the run, near the broker's clock: Kafka rolls a segment when a batch's timestamp is
# segment.ms (7 days) past the segment's first, so old timestamps would put every marker (the
# coordinator stamps it now) in a segment of its own. Timestamps the broker chose read "now".
BASE_BEHIND_MS = 3_600_000
BROKER_TIME = "now"
WAIT_S = 60.0
Step = tuple[str, Any]


def error(code: int) -> str:
    return ErrorCode(code).name


class Run:
    """One scenario run against one target; `steps` is its transcript."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.steps: list[Step] = []
        self._suffix = uuid.uuid4().hex[:8]
        self._pids: dict[int, str] = {}
        self._epoch_base: dict[int, int] = {}
        self._members: dict[str, str] = {}
        self._generation_base: int | None = None
        self._epoch_base_848: int | None = None
        self.base_timestamp = int(time.time() * 1000) - BASE_BEHIND_MS
        self._stamps: set[int] = {0}

    # -- names --------------------------------------------------------------------------------

    def name(self, logical: str) -> str:
        """The real name of the scenario's topic, transactional id or group `logical`."""
        return f"{logical}-{self._suffix}"

    def pid(self, producer_id: int) -> str | int:
        if producer_id < 0:
            return producer_id
        return self._pids.setdefault(producer_id, f"P{len(self._pids) + 1}")

    def epoch(self, producer_id: int, producer_epoch: int) -> int:
        if producer_id < 0 or producer_epoch < 0:
            return producer_epoch
        return producer_epoch - self._epoch_base.setdefault(producer_id, producer_epoch)

    def member(self, member_id: str) -> str:
        if not member_id:
            return ""
        return self._members.setdefault(member_id, f"M{len(self._members) + 1}")

    def generation(self, generation_id: int) -> int:
        if generation_id < 0:
            return generation_id
        if self._generation_base is None:
            self._generation_base = generation_id
        return generation_id - self._generation_base

    def member_epoch(self, epoch: int) -> int:
        """A KIP-848 epoch relative to the first one seen (Kafka 4.4 starts a group at 2,
        onceflow at 1, as Kafka 4.0 did); -1, -2 and 0 (errors, leaving) as they are."""
        if epoch <= 0:
            return epoch
        if self._epoch_base_848 is None:
            self._epoch_base_848 = epoch
        return epoch - self._epoch_base_848

    def record(self, label: str, value: Any) -> Any:
        assert label not in dict(self.steps), f"step label {label!r} used twice"
        self.steps.append((label, value))
        return value

    # -- setup (not part of the transcript) ---------------------------------------------------

    def create_topic(self, logical: str, partitions: int = 1, **configs: str) -> str:
        """A fresh topic, waited on until its partitions have a leader on the target."""
        topic = self.name(logical)
        response = self.target.call(
            *CREATE_TOPICS,
            topics=[
                {
                    "name": topic,
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": k, "value": v} for k, v in configs.items()],
                }
            ],
            timeout=30_000,
            validate_only=False,
        )
        [created] = response.topics
        assert created.error_code == ErrorCode.none, (topic, error(created.error_code))
        self.wait_for(
            f"a leader of {topic} on {self.target.name}",
            lambda: all(
                self.list_offsets_raw(topic, p, READ_UNCOMMITTED, LATEST)[0] == ErrorCode.none
                for p in range(partitions)
            ),
        )
        return topic

    def find_coordinator(self, key: str, key_type: int) -> None:
        """Wait until the target coordinates `key` (its internal topic made and loaded)."""
        self.wait_for(
            f"a coordinator of {key!r} on {self.target.name}",
            lambda: (
                self.target.call(*FIND_COORDINATOR, key=key, key_type=key_type).error_code
                == ErrorCode.none
            ),
        )

    def wait_for(self, what: str, condition: Callable[[], Any], timeout: float = WAIT_S) -> Any:
        return wait_for(condition, timeout, f"{what} on {self.target.name}")

    # -- producers and transactions -----------------------------------------------------------

    def init_producer_id(
        self,
        label: str,
        transactional_id: str | None = None,
        timeout_ms: int = 60_000,
        producer_id: int = -1,
        producer_epoch: int = -1,
    ) -> tuple[int, int]:
        """InitProducerId (retried while retriable): the producer id and epoch it gave."""
        if transactional_id is not None:
            self.find_coordinator(transactional_id, 1)
        response = self.target.call_retrying(
            *INIT_PRODUCER_ID,
            lambda r: r.error_code,
            transactional_id=transactional_id,
            transaction_timeout=timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
        )
        self.record(
            label,
            {
                "error": error(response.error_code),
                "producer_id": self.pid(response.producer_id),
                "epoch": self.epoch(response.producer_id, response.producer_epoch),
            },
        )
        return response.producer_id, response.producer_epoch

    def produce(
        self,
        label: str,
        topic: str,
        values: Iterable[bytes | tuple[bytes | None, bytes | None]],
        *,
        partition: int = 0,
        producer_id: int = -1,
        producer_epoch: int = -1,
        base_sequence: int = -1,
        transactional_id: str | None = None,
        timestamps: Iterable[int] | None = None,
    ) -> dict[str, Any]:
        """Produce v9, acks=all, of one batch of `values` (or (key, value) pairs)."""
        from onceflow.records.builder import build_batch

        pairs = [v if isinstance(v, tuple) else (None, v) for v in values]
        stamps = list(timestamps) if timestamps is not None else [0] * len(pairs)
        self._stamps.update(stamps)
        batch = build_batch(
            [(k, v, (), self.base_timestamp + t) for (k, v), t in zip(pairs, stamps, strict=True)],
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            transactional=transactional_id is not None,
        )
        response = self.target.call(
            *PRODUCE,
            transactional_id=transactional_id,
            acks=-1,
            timeout=30_000,
            topic_data=[
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        )
        [part] = response.responses[0].partition_responses
        return self.record(
            label,
            {
                "error": error(part.error_code),
                "base_offset": part.base_offset,
                "log_start_offset": part.log_start_offset,
                "record_errors": [r.batch_index for r in part.record_errors],
            },
        )

    def add_partitions(
        self, label: str, transactional_id: str, pid: int, epoch: int, topic: str, *parts: int
    ) -> str:
        response = self.target.call_retrying(
            *ADD_PARTITIONS_TO_TXN,
            lambda r: max(
                (
                    p.partition_error_code
                    for t in r.results_by_topic_v3_and_below
                    for p in t.results_by_partition
                ),
                default=0,
            ),
            v3_and_below_transactional_id=transactional_id,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[{"name": topic, "partitions": list(parts or (0,))}],
        )
        codes = sorted(
            {
                error(p.partition_error_code)
                for t in response.results_by_topic_v3_and_below
                for p in t.results_by_partition
            }
        )
        return self.record(label, codes[0] if len(codes) == 1 else codes)

    def add_offsets(
        self, label: str, transactional_id: str, pid: int, epoch: int, group: str
    ) -> str:
        response = self.target.call_retrying(
            *ADD_OFFSETS_TO_TXN,
            lambda r: r.error_code,
            transactional_id=transactional_id,
            producer_id=pid,
            producer_epoch=epoch,
            group_id=group,
        )
        return self.record(label, error(response.error_code))

    def txn_offset_commit(
        self,
        label: str,
        transactional_id: str,
        pid: int,
        epoch: int,
        group: str,
        topic: str,
        offset: int,
        *,
        generation_id: int = -1,
        member_id: str = "",
    ) -> str:
        self.find_coordinator(group, 0)
        response = self.target.call_retrying(
            *TXN_OFFSET_COMMIT,
            lambda r: r.topics[0].partitions[0].error_code,
            transactional_id=transactional_id,
            group_id=group,
            producer_id=pid,
            producer_epoch=epoch,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=None,
            topics=[
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        )
        return self.record(label, error(response.topics[0].partitions[0].error_code))

    def end_txn(self, label: str, transactional_id: str, pid: int, epoch: int, commit: bool) -> str:
        response = self.target.call_retrying(
            *END_TXN,
            lambda r: r.error_code,
            transactional_id=transactional_id,
            producer_id=pid,
            producer_epoch=epoch,
            committed=commit,
        )
        return self.record(label, error(response.error_code))

    def describe_transaction_raw(self, transactional_id: str) -> Any:
        response = self.target.call(*DESCRIBE_TRANSACTIONS, transactional_ids=[transactional_id])
        [state] = response.transaction_states
        return state

    def await_transaction(self, transactional_id: str, *states: str) -> None:
        """Wait until the transaction is in one of `states` (markers written, for the
        Complete* states); not a step: how long it takes is the broker's business."""
        states = states or ("CompleteCommit", "CompleteAbort", "Empty")
        self.wait_for(
            f"{transactional_id} in {states}",
            lambda: self.describe_transaction_raw(transactional_id).transaction_state in states,
        )

    def describe_transaction(self, label: str, transactional_id: str) -> dict[str, Any]:
        t = self.describe_transaction_raw(transactional_id)
        if t.error_code != ErrorCode.none:
            # No producer there: the fields are the schema's defaults, compared as they are.
            return self.record(
                label,
                {
                    "error": error(t.error_code),
                    "state": t.transaction_state,
                    "producer_id": t.producer_id,
                    "epoch": t.producer_epoch,
                    "start_time": t.transaction_start_time,
                    "timeout_ms": int(t.transaction_timeout.total_seconds() * 1000),
                },
            )
        return self.record(
            label,
            {
                "error": error(t.error_code),
                "state": t.transaction_state,
                "timeout_ms": int(t.transaction_timeout.total_seconds() * 1000),
                "started": t.transaction_start_time >= 0,
                "producer_id": self.pid(t.producer_id),
                "epoch": self.epoch(t.producer_id, t.producer_epoch),
                "partitions": sorted(
                    (self._logical(d.topic), p) for d in t.topics for p in d.partitions
                ),
            },
        )

    def describe_producers(self, label: str, topic: str, partition: int = 0) -> Any:
        response = self.target.call(
            *DESCRIBE_PRODUCERS, topics=[{"name": topic, "partition_indexes": [partition]}]
        )
        [p] = response.topics[0].partitions
        return self.record(
            label,
            {
                "error": error(p.error_code),
                "producers": sorted(
                    (
                        {
                            "producer_id": self.pid(s.producer_id),
                            "epoch": self.epoch(s.producer_id, s.producer_epoch),
                            "last_sequence": s.last_sequence,
                            "current_txn_start_offset": s.current_txn_start_offset,
                        }
                        for s in p.active_producers
                    ),
                    key=lambda d: str(d["producer_id"]),
                ),
            },
        )

    # -- reads --------------------------------------------------------------------------------

    def list_offsets_raw(
        self, topic: str, partition: int, isolation: int, timestamp: int
    ) -> tuple[int, int, int]:
        response = self.target.call(
            *LIST_OFFSETS,
            replica_id=-1,
            isolation_level=isolation,
            topics=[
                {
                    "name": topic,
                    "partitions": [{"partition_index": partition, "timestamp": timestamp}],
                }
            ],
        )
        [p] = response.topics[0].partitions
        return p.error_code, p.offset, p.timestamp

    def list_offsets(
        self, label: str, topic: str, isolation: int, timestamp: int, partition: int = 0
    ) -> dict[str, Any]:
        code, offset, stamp = self.list_offsets_raw(topic, partition, isolation, timestamp)
        answer: dict[str, Any] = {"error": error(code), "offset": offset}
        if timestamp not in (EARLIEST, LATEST):
            answer["timestamp"] = self.timestamp(stamp)
        return self.record(label, answer)

    def at(self, relative: int) -> int:
        """The absolute timestamp of the scenario's `relative` one (for ListOffsets)."""
        return self.base_timestamp + relative

    def timestamp(self, stamp: int) -> int | str:
        """A scenario's timestamp relative to the run's base; the broker's own reads "now"."""
        if stamp < 0:
            return stamp
        relative = stamp - self.base_timestamp
        return relative if relative in self._stamps else BROKER_TIME

    def fetch_raw(self, topic: str, offset: int, isolation: int, partition: int = 0) -> Any:
        response = self.target.call(
            *FETCH,
            cluster_id=None,
            replica_id=-1,
            max_wait=0,
            min_bytes=0,
            max_bytes=1 << 20,
            isolation_level=isolation,
            session_id=0,
            session_epoch=-1,
            topics=[
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": partition,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            forgotten_topics_data=[],
            rack_id="",
        )
        assert response.error_code == ErrorCode.none, error(response.error_code)
        [p] = response.responses[0].partitions
        return p

    def fetch_all(self, topic: str, isolation: int, partition: int = 0) -> list[dict[str, Any]]:
        """Every batch from the log start to the high watermark (or last stable offset), in as
        many fetches as it takes: Kafka answers a fetch from one segment only."""
        first = self.fetch_raw(topic, 0, isolation, partition)
        offset = max(first.log_start_offset, 0)
        bound = first.last_stable_offset if isolation == READ_COMMITTED else first.high_watermark
        out: list[dict[str, Any]] = []
        while offset < bound:
            got = self.batches(self.fetch_raw(topic, offset, isolation, partition).records)
            if not got:
                break
            out += got
            offset = got[-1]["offsets"][1] + 1
        return out

    def batches(self, records: bytes | None) -> list[dict[str, Any]]:
        out = []
        for batch in iter_decoded_batches(records or b""):
            h = batch.header
            entry: dict[str, Any] = {
                "offsets": (h.base_offset, h.last_offset),
                "producer_id": self.pid(h.producer_id),
                "epoch": self.epoch(h.producer_id, h.producer_epoch),
                "base_sequence": h.base_sequence,
                "transactional": h.is_transactional,
            }
            if h.is_control:
                entry["control"] = [parse_control_record(r)[0].name for r in batch]
            else:
                entry["records"] = [(r.key, r.value) for r in batch]
            out.append(entry)
        return out

    def fetch(
        self, label: str, topic: str, offset: int, isolation: int, partition: int = 0
    ) -> dict[str, Any]:
        p = self.fetch_raw(topic, offset, isolation, partition)
        aborted = p.aborted_transactions
        return self.record(
            label,
            {
                "error": error(p.error_code),
                "high_watermark": p.high_watermark,
                "last_stable_offset": p.last_stable_offset,
                "log_start_offset": p.log_start_offset,
                "aborted_transactions": None
                if aborted is None
                else sorted((self.pid(a.producer_id), a.first_offset) for a in aborted),
                "batches": self.batches(p.records),
            },
        )

    def delete_records(self, label: str, topic: str, offset: int, partition: int = 0) -> Any:
        response = self.target.call(
            *DELETE_RECORDS,
            topics=[
                {"name": topic, "partitions": [{"partition_index": partition, "offset": offset}]}
            ],
            timeout=30_000,
        )
        if response == UNSUPPORTED:
            return self.record(label, UNSUPPORTED)
        [p] = response.topics[0].partitions
        return self.record(label, {"error": error(p.error_code), "low_watermark": p.low_watermark})

    # -- groups -------------------------------------------------------------------------------

    def join_group(self, label: str, group: str, member_id: str = "") -> tuple[str, int]:
        """JoinGroup v6 of a consumer with one range protocol: (member id, generation)."""
        self.find_coordinator(group, 0)
        response = self.target.call_retrying(
            *JOIN_GROUP,
            lambda r: r.error_code,
            group_id=group,
            session_timeout=30_000,
            rebalance_timeout=30_000,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[{"name": "range", "metadata": b"\x00\x01"}],
        )
        self.record(
            label,
            {
                "error": error(response.error_code),
                "generation": self.generation(response.generation_id),
                "protocol": response.protocol_name,
                "leader": self.member(response.leader),
                "member_id": self.member(response.member_id),
                "members": sorted(self.member(m.member_id) for m in response.members),
            },
        )
        return response.member_id, response.generation_id

    def sync_group(self, label: str, group: str, member_id: str, generation: int) -> str:
        response = self.target.call(
            *SYNC_GROUP,
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id=None,
            assignments=[{"member_id": member_id, "assignment": b"\x00\x01"}],
        )
        return self.record(label, error(response.error_code))

    def describe_group(self, label: str, group: str) -> dict[str, Any]:
        response = self.target.call(
            *DESCRIBE_GROUPS, groups=[group], include_authorized_operations=False
        )
        [g] = response.groups
        return self.record(
            label,
            {
                "error": error(g.error_code),
                "state": g.group_state,
                "protocol_type": g.protocol_type,
                "protocol": g.protocol_data,
                "members": sorted(self.member(m.member_id) for m in g.members),
            },
        )

    def offset_fetch(self, label: str, group: str, topic: str, require_stable: bool) -> Any:
        self.find_coordinator(group, 0)
        response = self.target.call(
            *OFFSET_FETCH,
            group_id=group,
            topics=[{"name": topic, "partition_indexes": [0]}],
            require_stable=require_stable,
        )
        [p] = response.topics[0].partitions
        return self.record(
            label,
            {
                "error": error(response.error_code),
                "partition_error": error(p.error_code),
                "committed_offset": p.committed_offset,
            },
        )

    def _logical(self, name: str) -> str:
        return name.removesuffix(f"-{self._suffix}")

    # -- KIP-848 consumer groups -------------------------------------------------------------

    def topic_id(self, topic: str) -> uuid.UUID:
        response = self.target.call(
            *METADATA,
            topics=[{"name": topic, "topic_id": None}],
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        [t] = response.topics
        return t.topic_id

    def heartbeat(
        self,
        label: str,
        group: str,
        member_id: str,
        epoch: int,
        *,
        topics: list[str] | None = None,
        owned: dict[uuid.UUID, list[int]] | None = None,
        rebalance_timeout_ms: int = -1,
        assignor: str | None = None,
    ) -> tuple[int, list[int] | None]:
        """ConsumerGroupHeartbeat v1: (member epoch, assigned partitions of the one topic)."""
        self.member(member_id)  # members are named M1, M2... in the order they first heartbeat
        self.find_coordinator(group, 0)
        response = self.target.call_retrying(
            *CONSUMER_GROUP_HEARTBEAT,
            lambda r: r.error_code,
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=None,
            rack_id=None,
            rebalance_timeout=rebalance_timeout_ms,
            subscribed_topic_names=topics,
            subscribed_topic_regex=None,
            server_assignor=assignor,
            topic_partitions=(
                None
                if owned is None
                else [{"topic_id": t, "partitions": ps} for t, ps in owned.items()]
            ),
        )
        assigned = (
            None
            if response.assignment is None
            else sorted(p for tp in response.assignment.topic_partitions for p in tp.partitions)
        )
        self.record(
            label,
            {
                "error": error(response.error_code),
                "member_epoch": self.member_epoch(response.member_epoch),
                "heartbeat_interval_ms": int(response.heartbeat_interval.total_seconds() * 1000),
                "assignment": assigned,
            },
        )
        return response.member_epoch, assigned

    def offset_commit_v9(
        self, label: str, group: str, member_id: str, epoch: int, topic: str, offset: int
    ) -> str:
        response = self.target.call(
            *OFFSET_COMMIT,
            group_id=group,
            generation_id_or_member_epoch=epoch,
            member_id=member_id,
            group_instance_id=None,
            topics=[
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        )
        [p] = response.topics[0].partitions
        return self.record(label, error(p.error_code))

    def consumer_group_describe(self, label: str, group: str) -> dict[str, Any]:
        response = self.target.call(
            *CONSUMER_GROUP_DESCRIBE, group_ids=[group], include_authorized_operations=False
        )
        [g] = response.groups
        return self.record(
            label,
            {
                "error": error(g.error_code),
                "state": g.group_state,
                "group_epoch": self.member_epoch(g.group_epoch),
                "assignment_epoch": self.member_epoch(g.assignment_epoch),
                "assignor": g.assignor_name,
                "members": sorted(
                    (
                        self.member(m.member_id),
                        self.member_epoch(m.member_epoch),
                        sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions),
                        sorted(
                            p for tp in m.target_assignment.topic_partitions for p in tp.partitions
                        ),
                    )
                    for m in g.members
                ),
            },
        )
