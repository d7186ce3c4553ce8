"""The offset of a timestamp in a local log, as Kafka's UnifiedLog.fetchOffsetByTimestamp
finds it for ListOffsets: the first record at or after a time, or the record with the largest
timestamp (MAX_TIMESTAMP), below a bound the caller gives (the high watermark or the last stable
offset). The special timestamps themselves (earliest, latest) are the UnifiedLog's to answer.
"""

from __future__ import annotations

import logging

from onceflow.log.partition_log import PartitionLog
from onceflow.records.batch import check_batch, parse_header
from onceflow.records.errors import RecordsError
from onceflow.records.walker import walk_batch

# ListOffsets' special timestamps (Kafka's ListOffsetsRequest constants)
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
SPECIAL_TIMESTAMPS = frozenset(
    {
        LATEST_TIMESTAMP,
        EARLIEST_TIMESTAMP,
        MAX_TIMESTAMP,
        EARLIEST_LOCAL_TIMESTAMP,
        LATEST_TIERED_TIMESTAMP,
    }
)
NOT_FOUND = (-1, -1)

log = logging.getLogger(__name__)


def offset_for_time(local: PartitionLog, timestamp: int, upper: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record at or after `timestamp` below `upper`,
    or (-1, -1) when there is none."""
    found = local.offset_for_timestamp(timestamp)
    if found is None or found[0] >= upper:
        return NOT_FOUND
    # The first batch whose max timestamp reaches the target holds the record we want; its
    # records are walked as a stream up to the first match, never decompressed whole.
    match = _first_record_at(local, found[0], timestamp, upper)
    return match if match is not None else NOT_FOUND


def max_timestamp_offset(local: PartitionLog, upper: int) -> tuple[int, int]:
    """(offset, timestamp) of the record with the largest timestamp, when it is below `upper`
    ((-1, -1) otherwise), as Kafka answers MAX_TIMESTAMP: the segment with the largest max
    timestamp, then the one batch that holds it (a control batch too, as in Kafka), then its
    first record with that timestamp."""
    found = local.max_timestamp_and_offset()
    if found is None:
        return NOT_FOUND
    timestamp, last_offset = found
    if last_offset >= upper:
        # Kafka answers no offset while the record with the largest timestamp is not readable
        # yet (above the high watermark, or the last stable offset for read_committed); it does
        # not look for the largest timestamp below it.
        return NOT_FOUND
    if last_offset < local.log_start_offset:
        return _scan_max_timestamp(local, upper)
    match = _first_record_at(local, last_offset, timestamp, upper)
    return match if match is not None else NOT_FOUND


def _first_record_at(
    local: PartitionLog, offset: int, timestamp: int, upper: int
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or after `timestamp` in the batch holding
    `offset`; the batch's own (base offset, max timestamp) if it cannot be walked."""
    data = local.read(offset, 1, max_offset=upper).data
    if not data:
        return None
    try:
        header = check_batch(data, verify_crc=False)
        summary = walk_batch(data, 0, header, target_timestamp=timestamp, check_timestamps=False)
    except RecordsError as e:
        # Stored before Produce walked every record (or damaged on disk): answer the batch,
        # which holds the target by its max timestamp, rather than fail the request.
        log.warning("ListOffsets cannot walk the batch holding offset %d: %s", offset, e)
        header = parse_header(data)
        return header.base_offset, header.max_timestamp
    if summary.found is None:
        return None
    delta, ts = summary.found
    return header.base_offset + delta, ts


def _scan_max_timestamp(local: PartitionLog, upper: int) -> tuple[int, int]:
    best = NOT_FOUND
    for header in local.iter_batch_headers(local.log_start_offset):
        if header.base_offset >= upper:
            break
        if header.max_timestamp > best[1]:
            best = (header.base_offset, header.max_timestamp)
    if best[0] < 0:
        return best
    match = _first_record_at(local, best[0], best[1], upper)
    return match if match is not None else best
