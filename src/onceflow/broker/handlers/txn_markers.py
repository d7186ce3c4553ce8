"""WriteTxnMarkers (27): write COMMIT/ABORT markers to partitions on request.

In Kafka the transaction coordinator sends it to partition leaders; onceflow's coordinator writes
its markers in-process (coordinator/coordinators.py), so here it serves the admin path: Kafka's
`kafka-transactions.sh abort` (and `onceflow transactions abort --topic --partition
--start-offset`) uses it to close a hanging transaction on a partition. As Kafka's handler: each
partition gets its own error, the markers are appended in request order, and the answer is sent
once they are durable.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.durability import NotDurableError
from onceflow.broker.handlers.context import DataContext
from onceflow.broker.handlers.responses import partition_errors, response_classes
from onceflow.broker.storage_failure import halt_on_storage_error
from onceflow.log.errors import DescriptorsExhaustedError
from onceflow.log.producer_errors import TxnError
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth
from onceflow.txn.coordinator import OFFSETS_TOPIC

if TYPE_CHECKING:
    from onceflow.broker.partition import Partition
    from onceflow.log.partition_log import PartitionLog
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)


def handle_write_txn_markers(ctx: DataContext, request: Request) -> Any:
    # Appends happen here, synchronously and in arrival order; only durability is awaited.
    written: list[Partition] = []  # what the request appended, to make durable first
    results: list[dict[tuple[str, int], ErrorCode]] = []
    # Only brokers write markers: CLUSTER_ACTION on the Cluster (super users, in practice).
    allowed = auth.authorize_cluster(request.session, auth.CLUSTER_ACTION)
    for marker in request.body.markers:
        errors: dict[tuple[str, int], ErrorCode] = {}
        for topic in marker.topics:
            for index in topic.partition_indexes:
                errors[(topic.name, index)] = (
                    _append(ctx, written, marker, topic.name, index)
                    if allowed
                    else ErrorCode.cluster_authorization_failed
                )
        results.append(errors)
    return _answer_when_durable(ctx, request, written, results)


def _append(
    ctx: DataContext, written: list[Partition], marker: Any, topic: str, index: int
) -> ErrorCode:
    commit = bool(marker.transaction_result)
    # The offsets log keeps no producer epochs to check a marker against, so a stale one could
    # settle a newer transaction's offsets: only the coordinator writes markers there.
    partition = None if topic == OFFSETS_TOPIC else ctx.topics.partition(topic, index)
    if partition is None:
        return ErrorCode.unknown_topic_or_partition
    try:
        partition.append_marker(
            marker.producer_id,
            marker.producer_epoch,
            commit,
            marker.coordinator_epoch,
            ctx.clock(),
            # v2 carries the transaction's version (v1: 0, Kafka's default): from 2 on the
            # marker must bump the producer's epoch in the partition
            transaction_version=getattr(marker, "transaction_version", 0),
        )
    except TxnError as e:
        halt_on_storage_error(e)  # the marker is in the log, its aborted-index entry is not
        # An older epoch (INVALID_PRODUCER_EPOCH) or coordinator epoch: nothing was written.
        log.info("marker for %s-%d refused: %s", topic, index, e)
        return e.error_code
    except OSError as e:
        halt_on_storage_error(e)
        log.error("marker append to %s-%d failed: %s", topic, index, e)
        return ErrorCode.kafka_storage_error
    except DescriptorsExhaustedError as e:
        log.warning("marker append to %s-%d postponed: %s", topic, index, e)
        return ErrorCode.kafka_storage_error  # nothing written; the sender retries
    log.info(
        "%s marker written to %s-%d for producer %d (epoch %d) by request",
        "COMMIT" if commit else "ABORT",
        topic,
        index,
        marker.producer_id,
        marker.producer_epoch,
    )
    written.append(partition)
    return ErrorCode.none


async def _answer_when_durable(
    ctx: DataContext,
    request: Request,
    written: list[Partition],
    results: list[dict[tuple[str, int], ErrorCode]],
) -> Any:
    partitions = list(dict.fromkeys(written))  # a partition may be named twice
    logs: list[PartitionLog] = [p.log for p in partitions]
    failures: dict[PartitionLog, BaseException] = {}
    if logs:
        try:
            await ctx.durability.wait_durable(logs)
        except NotDurableError as e:
            failures = e.failures  # deleted since, or not yet synced: those answer an error
    for partition in partitions:
        error = failures.get(partition.log)
        if error is None:
            continue  # durable: the partition woke its readers itself
        code = ctx.durability.not_durable_code(partition, error)
        for errors in results:
            if errors.get((partition.topic, partition.index)) == ErrorCode.none:
                errors[(partition.topic, partition.index)] = code
    return _response(request, results)


def _response(request: Request, results: list[dict[tuple[str, int], ErrorCode]]) -> Any:
    cls, marker_cls, topic_cls, part_cls = response_classes(
        request,
        "WritableTxnMarkerResult",
        "WritableTxnMarkerTopicResult",
        "WritableTxnMarkerPartitionResult",
    )
    markers = tuple(
        build(
            marker_cls,
            producer_id=marker.producer_id,
            topics=partition_errors(errors, topic_cls, part_cls),
        )
        for marker, errors in zip(request.body.markers, results, strict=True)
    )
    return build(cls, markers=markers)
