"""The batches the broker stored, fetched raw: what codec and producer ids the clients'
batches carry."""

from __future__ import annotations

from onceflow.records.batch import BatchHeader, iter_batches
from onceflow.records.compression import CompressionType
from tests.admin_requests import call
from tests.wire import fetch_request


def stored_batches(bootstrap: str, topic: str, partitions: int) -> list[BatchHeader]:
    """The headers of the batches as the broker stores them, fetched raw."""
    request = fetch_request(
        topic,
        dict.fromkeys(range(partitions), 0),
        partition_max_bytes=1 << 24,
        max_bytes=1 << 26,
        min_bytes=0,
    )
    response = call(bootstrap, request)
    return [
        header
        for topic_response in response.responses
        for part in topic_response.partitions
        for _, header in iter_batches(part.records or b"")
    ]


def stored_codecs(bootstrap: str, topic: str, partitions: int) -> set[str]:
    headers = stored_batches(bootstrap, topic, partitions)
    return {CompressionType(h.compression).name.lower() for h in headers}


def assert_idempotent(bootstrap: str, topic: str, partitions: int) -> None:
    """Every stored batch carries a producer id and sequences, as an idempotent producer sends."""
    headers = stored_batches(bootstrap, topic, partitions)
    assert headers
    assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in headers)
