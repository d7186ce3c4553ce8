"""Transactions version 2 (KIP-890 part 2) over the wire, as a Kafka 4 client speaks it.

The feature `transaction.version` is advertised and finalized in ApiVersions (2 by default,
the broker setting `transaction.version` 0/1 turns it off and the broker answers as before:
EndTxn up to v4, TxnOffsetCommit up to v4, nothing finalized). A version 2 producer sends no
AddPartitionsToTxn or AddOffsetsToTxn: Produce v12 and TxnOffsetCommit v5 add the partitions;
EndTxn v5 bumps the epoch and answers it; a late Produce of the ended transaction (same
producer id, old epoch) is refused with INVALID_PRODUCER_EPOCH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.clock import system_clock
from onceflow.log.config import LogConfig
from onceflow.log.unified_log import UnifiedLog
from onceflow.protocol.api_key import ApiKey
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.record import iter_decoded_batches
from onceflow.txn.transaction_log import decode_value, encode_key, encode_value
from onceflow.txn.transaction_metadata import MAX_PRODUCER_EPOCH
from tests.confluent import create_topic
from tests.waiting import wait_for
from tests.wire import WAIT, WireClient, request_entity

PRODUCE_V2 = 12
END_TXN_V2 = 5


@pytest.fixture(scope="module")
def tv2_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    broker = EmbeddedBroker(tmp_path_factory.mktemp("tv2"))
    broker.start()
    yield broker
    broker.stop()


def _batch(producer_id: int, epoch: int, sequence: int, value: bytes = b"v") -> bytes:
    return build_batch(
        [(None, value, (), 1_700_000_000_000)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=True,
    )


class Tv2Producer:
    """A transactions version 2 producer over a raw connection."""

    def __init__(self, address: str, transactional_id: str) -> None:
        self.wire = WireClient(address)
        self.transactional_id = transactional_id
        answer = self.wire.request(
            ApiKey.INIT_PRODUCER_ID,
            5,
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=-1,
            producer_epoch=-1,
        )
        assert answer.error_code == ErrorCode.none
        self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
        self.sequence = 0

    def produce_request(
        self,
        topic: str,
        partition: int,
        *,
        epoch: int | None = None,
        version: int = PRODUCE_V2,
        sequence: int = 0,
    ) -> Any:
        epoch = self.epoch if epoch is None else epoch
        batch = _batch(self.producer_id, epoch, sequence, b"%d" % sequence)
        return request_entity(
            ApiKey.PRODUCE,
            version,
            transactional_id=self.transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=WAIT),
            topic_data=(_topic_data(version, topic, partition, batch),),
        )

    def produce(
        self, topic: str, partition: int, *, epoch: int | None = None, version: int = PRODUCE_V2
    ) -> ErrorCode:
        answer = self.wire.call(
            self.produce_request(topic, partition, epoch=epoch, version=version)
        )
        [topic_answer] = answer.responses
        [part] = topic_answer.partition_responses
        return part.error_code

    def end(self, commit: bool, *, epoch: int | None = None) -> Any:
        return self.wire.request(
            ApiKey.END_TXN,
            END_TXN_V2,
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.epoch if epoch is None else epoch,
            committed=commit,
        )

    def describe(self) -> Any:
        return _describe(self.wire, self.transactional_id)


def _describe(wire: WireClient, transactional_id: str) -> Any:
    answer = wire.request(ApiKey.DESCRIBE_TRANSACTIONS, 0, transactional_ids=(transactional_id,))
    [state] = answer.transaction_states
    return state


def _topic_data(version: int, topic: str, partition: int, records: bytes) -> Any:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.PRODUCE, version)
    topic_cls = sibling(cls, "TopicProduceData")
    part_cls = sibling(cls, "PartitionProduceData")
    return build(
        topic_cls,
        name=topic,
        partition_data=(build(part_cls, index=partition, records=records),),
    )


def _features(address: str) -> tuple[dict[str, tuple[int, int]], dict[str, int], int, Any]:
    with WireClient(address) as wire:
        answer = wire.request(
            ApiKey.API_VERSIONS, 4, client_software_name="t", client_software_version="1"
        )
    supported = {f.name: (f.min_version, f.max_version) for f in answer.supported_features}
    finalized = {f.name: f.max_version_level for f in answer.finalized_features}
    versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    return supported, finalized, answer.finalized_features_epoch, versions


def test_api_versions_finalize_transaction_version_2(tv2_broker: EmbeddedBroker) -> None:
    supported, finalized, epoch, versions = _features(tv2_broker.bootstrap)
    assert supported == {"transaction.version": (0, 2)}
    assert finalized == {"transaction.version": 2}
    assert epoch >= 0  # clients ignore the features of an epoch below the one they know
    assert versions[ApiKey.END_TXN] == (0, 5)
    assert versions[ApiKey.TXN_OFFSET_COMMIT] == (0, 5)
    assert versions[ApiKey.ADD_PARTITIONS_TO_TXN] == (0, 3)


@pytest.mark.parametrize("level", ["0", "1"])
def test_version_2_off_answers_as_before(make_broker: Any, level: str) -> None:
    broker = make_broker(settings={"transaction.version": level})
    supported, finalized, _, versions = _features(broker.bootstrap)
    assert supported == {"transaction.version": (0, 2)}
    assert finalized == ({} if level == "0" else {"transaction.version": 1})
    assert versions[ApiKey.END_TXN] == (0, 4)
    assert versions[ApiKey.TXN_OFFSET_COMMIT] == (0, 4)
    # Produce v12 of a transactional producer does not add its partition: KIP-890 part 1.
    topic = f"tv-off-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    producer = Tv2Producer(broker.bootstrap, f"off-{level}")
    assert producer.produce(topic, 0) == ErrorCode.transaction_abortable


def test_commit_bumps_the_epoch_and_fences_a_late_produce(tv2_broker: EmbeddedBroker) -> None:
    topic = f"tv2-{uuid.uuid4().hex[:8]}"
    create_topic(tv2_broker.bootstrap, topic, partitions=2)
    producer = Tv2Producer(tv2_broker.bootstrap, f"tv2-{topic}")
    # No AddPartitionsToTxn: Produce v12 adds the partition.
    assert producer.produce(topic, 0) == ErrorCode.none
    state = producer.describe()
    assert (state.transaction_state, [t.topic for t in state.topics]) == ("Ongoing", [topic])
    old_epoch = producer.epoch
    answer = producer.end(commit=True)
    assert answer.error_code == ErrorCode.none
    assert (answer.producer_id, answer.producer_epoch) == (producer.producer_id, old_epoch + 1)
    # Once the markers are written, the retried EndTxn of the same commit succeeds, with the
    # same answer (before, it is CONCURRENT_TRANSACTIONS, as Kafka answers).
    wait_for(lambda: producer.describe().transaction_state == "CompleteCommit", 30, "markers")
    retried = producer.end(commit=True, epoch=old_epoch)
    assert (retried.error_code, retried.producer_epoch) == (ErrorCode.none, old_epoch + 1)
    # A write of the ended transaction arriving late cannot open the next one.
    assert producer.produce(topic, 0, epoch=old_epoch) == ErrorCode.invalid_producer_epoch
    assert producer.produce(topic, 1, epoch=old_epoch) == ErrorCode.invalid_producer_epoch
    assert producer.describe().transaction_state == "CompleteCommit"
    # The producer goes on with the new epoch.
    producer.epoch = answer.producer_epoch
    assert producer.produce(topic, 0) == ErrorCode.none
    wait_for(lambda: producer.describe().transaction_state == "Ongoing", 30, "the add")
    aborted = producer.end(commit=False)
    assert (aborted.error_code, aborted.producer_epoch) == (ErrorCode.none, old_epoch + 2)


def test_txn_offset_commit_v5_adds_the_offsets_partition(tv2_broker: EmbeddedBroker) -> None:
    topic = f"tv2-offsets-{uuid.uuid4().hex[:8]}"
    create_topic(tv2_broker.bootstrap, topic)
    producer = Tv2Producer(tv2_broker.bootstrap, f"tv2-{topic}")
    group = f"group-{topic}"
    answer = producer.wire.request(
        ApiKey.TXN_OFFSET_COMMIT,
        5,
        transactional_id=producer.transactional_id,
        group_id=group,
        producer_id=producer.producer_id,
        producer_epoch=producer.epoch,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=(_txn_offset_topic(topic, 0, 42),),
    )
    [topic_answer] = answer.topics
    assert [p.error_code for p in topic_answer.partitions] == [ErrorCode.none]
    assert [t.topic for t in producer.describe().topics] == ["__consumer_offsets"]
    assert producer.end(commit=True).error_code == ErrorCode.none

    def committed() -> list[int]:
        with WireClient(tv2_broker.bootstrap) as wire:
            fetched = wire.request(
                ApiKey.OFFSET_FETCH,
                7,
                group_id=group,
                topics=(_offset_fetch_topic(topic),),
                require_stable=True,
            )
        [fetched_topic] = fetched.topics
        return [p.committed_offset for p in fetched_topic.partitions]

    # Stable once the commit's markers are written (UNSTABLE_OFFSET_COMMIT and -1 until then).
    wait_for(lambda: committed() == [42], 30, committed)


def _txn_offset_topic(topic: str, partition: int, offset: int) -> Any:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.TXN_OFFSET_COMMIT, 5)
    part = build(
        sibling(cls, "TxnOffsetCommitRequestPartition"),
        partition_index=partition,
        committed_offset=offset,
        committed_leader_epoch=-1,
        committed_metadata=None,
    )
    return build(sibling(cls, "TxnOffsetCommitRequestTopic"), name=topic, partitions=(part,))


def _offset_fetch_topic(topic: str) -> Any:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.OFFSET_FETCH, 7)
    return build(sibling(cls, "OffsetFetchRequestTopic"), name=topic, partition_indexes=(0,))


def test_pipelined_first_writes_to_two_partitions_both_join(tv2_broker: EmbeddedBroker) -> None:
    """Two Produce v12 sent together, each opening the transaction on its partition: the
    second add waits for the first's (no NOT_ENOUGH_REPLICAS, which costs the client a retry
    and, for its TxnOffsetCommit, the transaction)."""
    topic = f"tv2-pipe-{uuid.uuid4().hex[:8]}"
    create_topic(tv2_broker.bootstrap, topic, partitions=2)
    producer = Tv2Producer(tv2_broker.bootstrap, f"tv2-{topic}")
    requests = [producer.produce_request(topic, p) for p in (0, 1)]
    ids = [producer.wire.send(r) for r in requests]
    answers = [producer.wire.receive(r, i) for r, i in zip(requests, ids, strict=True)]
    errors = [a.responses[0].partition_responses[0].error_code for a in answers]
    assert errors == [ErrorCode.none, ErrorCode.none]
    assert sorted(p for t in producer.describe().topics for p in t.partitions) == [0, 1]


def test_a_produce_behind_one_waiting_for_its_add_appends_after_it(make_broker: Any) -> None:
    """The producer's first Produce of a partition waits for its add (held 3 s after the add
    by a delay point); its next Produce arrives once the partition has joined, pipelined on the
    same connection: it appends after the first, not before (which was refused
    OUT_OF_ORDER_SEQUENCE_NUMBER: Kafka's ProducerPerformance failed so, transactional)."""
    broker = make_broker(env={"ONCEFLOW_DELAY_AT": "produce.after-add:3000:1"})
    topic = f"tv2-order-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    producer = Tv2Producer(broker.bootstrap, f"tv2-{topic}")
    requests = [producer.produce_request(topic, 0, sequence=s) for s in (0, 1)]
    first = producer.wire.send(requests[0])
    with WireClient(broker.bootstrap) as admin:
        wait_for(lambda: _ongoing(admin) == [producer.transactional_id], 30, "the first's add")
    assert not producer.wire.readable(), "the first Produce was answered before the second went"
    second = producer.wire.send(requests[1])
    answers = [
        producer.wire.receive(requests[0], first),
        producer.wire.receive(requests[1], second),
    ]
    parts = [a.responses[0].partition_responses[0] for a in answers]
    assert [(p.error_code, p.base_offset) for p in parts] == [
        (ErrorCode.none, 0),
        (ErrorCode.none, 1),
    ]


def _ongoing(wire: WireClient) -> list[str]:
    """The transactional ids whose transaction is ongoing (ListTransactions)."""
    answer = wire.request(
        ApiKey.LIST_TRANSACTIONS, 0, state_filters=("Ongoing",), producer_id_filters=()
    )
    return [t.transactional_id for t in answer.transaction_states]


def _write_marker(
    wire: WireClient,
    version: int,
    topic: str,
    producer: Tv2Producer,
    epoch: int,
    coordinator_epoch: int,
    transaction_version: int,
) -> ErrorCode:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.WRITE_TXN_MARKERS, version)
    fields: dict[str, Any] = {"transaction_version": transaction_version} if version >= 2 else {}
    marker = build(
        sibling(cls, "WritableTxnMarker"),
        producer_id=producer.producer_id,
        producer_epoch=epoch,
        transaction_result=True,
        topics=(build(sibling(cls, "WritableTxnMarkerTopic"), name=topic, partition_indexes=(0,)),),
        coordinator_epoch=coordinator_epoch,
        **fields,
    )
    answer = wire.request(ApiKey.WRITE_TXN_MARKERS, version, markers=(marker,))
    [result] = answer.markers
    [topic_result] = result.topics
    [part] = topic_result.partitions
    return part.error_code


def _producer_state(wire: WireClient, topic: str, producer_id: int, partition: int = 0) -> Any:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.DESCRIBE_PRODUCERS, 0)
    request = build(sibling(cls, "TopicRequest"), name=topic, partition_indexes=(partition,))
    answer = wire.request(ApiKey.DESCRIBE_PRODUCERS, 0, topics=(request,))
    [part] = answer.topics[0].partitions
    [state] = [s for s in part.active_producers if s.producer_id == producer_id]
    return state


def _end_offset(wire: WireClient, topic: str, partition: int) -> int:
    from kio.index import load_request_schema

    from onceflow.protocol.entities import build, sibling

    cls = load_request_schema(ApiKey.LIST_OFFSETS, 1)
    latest = build(sibling(cls, "ListOffsetsPartition"), partition_index=partition, timestamp=-1)
    request = build(sibling(cls, "ListOffsetsTopic"), name=topic, partitions=(latest,))
    answer = wire.request(ApiKey.LIST_OFFSETS, 1, replica_id=-1, topics=(request,))
    [part] = answer.topics[0].partitions
    assert part.error_code == ErrorCode.none
    return int(part.offset)


def test_a_late_version_2_marker_cannot_close_the_next_transaction(
    tv2_broker: EmbeddedBroker,
) -> None:
    """WriteTxnMarkers v2 carries the transaction version. The commit's marker (written by the
    coordinator) bumped the epoch, and the next transaction writes at that epoch: a late
    marker of the commit, at that same epoch, is refused INVALID_PRODUCER_EPOCH for a version
    2 transaction and the next one stays open; versions 0/1 (v1 requests) accept it, as Kafka."""
    topic = f"tv2-late-{uuid.uuid4().hex[:8]}"
    create_topic(tv2_broker.bootstrap, topic)
    producer = Tv2Producer(tv2_broker.bootstrap, f"tv2-{topic}")
    assert producer.produce(topic, 0) == ErrorCode.none
    answer = producer.end(commit=True)
    assert answer.error_code == ErrorCode.none
    wait_for(lambda: producer.describe().transaction_state == "CompleteCommit", 30, "markers")
    producer.epoch = answer.producer_epoch
    assert producer.produce(topic, 0) == ErrorCode.none  # the next transaction, open at 2
    with WireClient(tv2_broker.bootstrap) as admin:
        state = _producer_state(admin, topic, producer.producer_id)
        assert (state.producer_epoch, state.current_txn_start_offset) == (producer.epoch, 2)
        late = (admin, 2, topic, producer, producer.epoch, state.coordinator_epoch)
        assert _write_marker(*late, transaction_version=2) == ErrorCode.invalid_producer_epoch
        assert _producer_state(admin, topic, producer.producer_id).current_txn_start_offset == 2
        # Transactions version 0/1 markers keep the epoch: the same one is accepted.
        legacy = (admin, 1, topic, producer, producer.epoch, state.coordinator_epoch)
        assert _write_marker(*legacy, transaction_version=0) == ErrorCode.none
        assert _producer_state(admin, topic, producer.producer_id).current_txn_start_offset == -1
    assert producer.end(commit=False).error_code == ErrorCode.none
    wait_for(lambda: producer.describe().transaction_state == "CompleteAbort", 30, "the abort")


def _rewrite_epoch(data_dir: Path, transactional_id: str, epoch: int) -> None:
    """Append to the stopped broker's `__transaction_state` the id's record at `epoch`, as
    thousands of transactions would leave it (the load takes an epoch that grew)."""
    directory = data_dir / "__transaction_state-0"
    log = UnifiedLog.open(
        "__transaction_state", 0, directory, LogConfig(), system_clock, 86_400_000
    )
    try:
        batches = [d for data in log.log.read_batches_bytes(0) for d in iter_decoded_batches(data)]
        [last] = [
            decode_value(r.value)
            for batch in batches
            for r in batch.records
            if r.key == encode_key(transactional_id) and r.value is not None
        ][-1:]
        value = dataclasses.replace(last, producer_epoch=epoch)
        data = build_batch(
            [(encode_key(transactional_id), encode_value(value), (), system_clock())]
        )
        info = log.log.append(data, list(iter_batches(data, verify_crc=False)))
        log.after_append([h for _, h in info.headers])
        log.log.complete_flush(log.log.prepare_flush())
    finally:
        log.close()


def test_an_exhausted_epoch_moves_the_producer_to_a_new_id(make_broker: Any) -> None:
    """The producer's transaction reaches epoch Short.MaxValue - 1 (set up by a record in the
    stopped broker's log): its EndTxn v5 bumps to Short.MaxValue, writes the markers with it and
    answers a new producer id at epoch 0, with which the producer goes on; the old id's
    late writes are refused (only unit-tested before: tests/txn/test_transactions_v2.py)."""
    broker = make_broker()
    topic = f"tv2-overflow-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic)
    producer = Tv2Producer(broker.bootstrap, f"tv2-{topic}")
    assert producer.produce(topic, 0) == ErrorCode.none
    producer.wire.close()
    broker.stop()
    _rewrite_epoch(broker.data_dir, producer.transactional_id, MAX_PRODUCER_EPOCH - 1)
    broker.start()
    old_id, producer.epoch = producer.producer_id, MAX_PRODUCER_EPOCH - 1
    producer.wire = WireClient(broker.bootstrap)
    assert producer.describe().producer_epoch == MAX_PRODUCER_EPOCH - 1
    answer = producer.end(commit=True)
    assert answer.error_code == ErrorCode.none
    assert answer.producer_id != old_id and answer.producer_epoch == 0
    wait_for(lambda: producer.describe().transaction_state == "CompleteCommit", 30, "markers")
    with WireClient(broker.bootstrap) as admin:
        state = _producer_state(admin, topic, old_id)
        assert (state.producer_epoch, state.current_txn_start_offset) == (MAX_PRODUCER_EPOCH, -1)
    # A late write of the old id: the transactional id has moved on, the add refuses it.
    assert producer.produce(topic, 0) == ErrorCode.invalid_producer_id_mapping
    producer.producer_id, producer.epoch = answer.producer_id, answer.producer_epoch
    assert producer.produce(topic, 0) == ErrorCode.none
    aborted = producer.end(commit=False)
    assert (aborted.error_code, aborted.producer_id, aborted.producer_epoch) == (
        ErrorCode.none,
        answer.producer_id,
        1,
    )
    producer.wire.close()


def test_kill_9_between_the_markers_completes_with_version_2_markers(make_broker: Any) -> None:
    """kill -9 once the first partition's marker is written; the restarted broker writes the
    markers anew from its log. The transaction's version survives in `__transaction_state`
    (ClientTransactionVersion), so they are version 2 markers: the first partition takes its
    marker's retry (same epoch, no transaction open) as Kafka does, the second its first
    marker, and the producer goes on at the bumped epoch."""
    broker = make_broker(env={"ONCEFLOW_CRASH_AT": "txn.after-marker:1"})
    topic = f"tv2-crash-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    producer = Tv2Producer(broker.bootstrap, f"tv2-{topic}")
    old_epoch = producer.epoch
    assert producer.produce(topic, 0) == ErrorCode.none
    assert producer.produce(topic, 1) == ErrorCode.none
    with contextlib.suppress(ConnectionError):  # answered before the markers, or cut by the kill
        producer.end(commit=True)
    producer.wire.close()
    assert broker.process is not None
    wait_for(lambda: broker.process.poll() is not None, 30, "the kill at the crash point")
    broker.env = {}
    broker.start()
    producer.wire = WireClient(broker.bootstrap)
    wait_for(lambda: producer.describe().transaction_state == "CompleteCommit", 30, "markers")
    retried = producer.end(commit=True, epoch=old_epoch)
    assert (retried.error_code, retried.producer_epoch) == (ErrorCode.none, old_epoch + 1)
    with WireClient(broker.bootstrap) as admin:
        for partition in (0, 1):
            state = _producer_state(admin, topic, producer.producer_id, partition)
            assert (state.producer_epoch, state.current_txn_start_offset) == (old_epoch + 1, -1)
        # Partition 0: the record, its marker, the marker's retry; partition 1: one marker.
        assert [_end_offset(admin, topic, partition) for partition in (0, 1)] == [3, 2]
    producer.epoch = retried.producer_epoch
    assert producer.produce(topic, 0) == ErrorCode.none
    assert producer.end(commit=True).producer_epoch == old_epoch + 2
    producer.wire.close()
