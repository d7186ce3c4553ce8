"""File descriptors stay bounded however small the segments are (finding 5).

A broker runs with RLIMIT_NOFILE=1024 and one producer sends four times as many tiny batches
to a topic whose every batch rolls a segment (`segment.bytes=100`, or `segment.ms=1` with
record timestamps 2 ms apart). Before the descriptor cache each rolled segment kept its file
open and the broker halted on EMFILE; now its open descriptors stay under the cache's share of
the limit, every record reads back, and a kill -9 and restart under the same limit recovers
them all.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.embedded import EmbeddedBroker
from onceflow.log.file_handles import capacity_for_limit
from onceflow.records.builder import build_batch
from tests.confluent import create_topic
from tests.hostile.ledger import Ledger
from tests.wire import WireClient, produce_request

LIMIT = 1024
WINDOW = 48  # pipelined requests, below the broker's in-flight bound per connection
PIN_SLACK = 16  # descriptors pinned by requests in flight can exceed the cache briefly
FIRST_TIMESTAMP = 1_700_000_000_000


def produce_pipelined(
    broker: EmbeddedBroker, topic: str, values: list[bytes], timestamp_step_ms: int
) -> int:
    """One batch of one record per Produce (acks=all), WINDOW at a time on one connection;
    returns the most descriptors the broker held meanwhile."""
    client = WireClient(broker.bootstrap)
    peak = broker.open_fds()
    try:
        for start in range(0, len(values), WINDOW):
            sent = []
            for i in range(start, min(start + WINDOW, len(values))):
                timestamp = FIRST_TIMESTAMP + i * timestamp_step_ms
                batch = build_batch([(None, values[i], (), timestamp)])
                assert len(batch) < 100  # every batch rolls a 100-byte segment
                request = produce_request(topic, {0: batch})
                sent.append((request, client.send(request)))
            for request, correlation_id in sent:
                response = client.receive(request, correlation_id)
                [part] = response.responses[0].partition_responses
                assert part.error_code == ErrorCode.none, part.error_message
            peak = max(peak, broker.open_fds())
    finally:
        client.close()
    return peak


@pytest.mark.slow
@pytest.mark.timeout(1200)  # every roll creates files: ~15 ms each on a shared disk
@pytest.mark.parametrize(
    ("config", "timestamp_step_ms", "batches"),
    [
        # The finding: ~19,000 batches halted the broker at the default limit. Under this
        # test's limit four times as many segments as descriptors show it (without the cache
        # every segment kept a descriptor: it halted before LIMIT); every roll creates files.
        ({"segment.bytes": "100"}, 0, 4 * LIMIT),
        ({"segment.ms": "1"}, 2, 4 * LIMIT),
    ],
    ids=["segment.bytes=100", "segment.ms=1"],
)
def test_tiny_segments_do_not_exhaust_descriptors(
    make_broker: Callable[..., EmbeddedBroker],
    topic_name: str,
    config: dict[str, str],
    timestamp_step_ms: int,
    batches: int,
) -> None:
    broker = make_broker(open_files_limit=LIMIT, fsync=False)
    create_topic(broker.bootstrap, topic_name, 1, **config)
    bound = broker.open_fds() + capacity_for_limit(LIMIT) + PIN_SLACK
    ledger = Ledger(broker, topic_name, partitions=1)
    values = [f"r{i}".encode() for i in range(batches)]

    peak = produce_pipelined(broker, topic_name, values, timestamp_step_ms)
    ledger.expected[0] = list(values)

    assert peak <= bound < LIMIT
    segments = list((broker.data_dir).rglob(f"{topic_name}-0/*.log"))
    assert len(segments) >= batches  # each batch did roll a segment
    ledger.assert_intact()  # alive, writable, and every record reads back

    broker.kill()  # kill -9: no clean shutdown, a recovery under the same limit
    broker.start(timeout=300)
    assert broker.open_fds() <= bound
    ledger.assert_intact()
    assert broker.open_fds() <= bound


def test_many_partitions_under_a_low_limit(
    make_broker: Callable[..., EmbeddedBroker], topic_name: str
) -> None:
    """Partitions that are not being written hold no descriptors once others need them: a
    topic of more partitions than the limit allows files for is created, written and read."""
    limit = 256  # each partition held 4 files before (directory, .log, .index, .timeindex)
    partitions = 300
    broker = make_broker(open_files_limit=limit, fsync=False)
    bound = broker.open_fds() + capacity_for_limit(limit) + PIN_SLACK
    create_topic(broker.bootstrap, topic_name, partitions)
    assert broker.open_fds() <= bound
    ledger = Ledger(broker, topic_name, partitions=partitions)
    client = WireClient(broker.bootstrap)
    try:
        for start in range(0, partitions, WINDOW):
            parts = range(start, min(start + WINDOW, partitions))
            batches = {
                p: build_batch([(None, f"p{p}".encode(), (), FIRST_TIMESTAMP)]) for p in parts
            }
            response = client.call(produce_request(topic_name, batches))
            errors = {p.index: p.error_code for p in response.responses[0].partition_responses}
            assert errors == dict.fromkeys(parts, ErrorCode.none)
            for p in parts:
                ledger.expected[p] = [f"p{p}".encode()]
    finally:
        client.close()
    assert broker.open_fds() <= bound
    ledger.assert_intact()
