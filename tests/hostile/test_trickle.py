"""Slow senders on a PLAINTEXT listener (issue 19, item 1, beyond its recipe): connections that
announce huge frames and trickle them, or that send queued.max.request.bytes of partial frames
and then trickle, do not keep other clients waiting (served within 1 s throughout)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

from onceflow.broker.embedded import EmbeddedBroker
from tests.confluent import create_topic
from tests.hostile.test_connections import wait_quiet
from tests.hostile.victims import (
    ROUND_TRIP_TIMEOUT,
    Trickler,
    Victims,
    size_prefix,
    trickle_while_served,
)
from tests.waiting import wait_for, wait_for_line
from tests.wire import WireClient, api_versions_request, good_batch, produce_request

MiB = 1 << 20
MakeBroker = Callable[..., EmbeddedBroker]


def _small_requests(broker: EmbeddedBroker, steady: WireClient) -> dict[str, Callable[[], object]]:
    def new_connection() -> None:
        with WireClient(broker.bootstrap, timeout=ROUND_TRIP_TIMEOUT) as client:
            assert client.call(api_versions_request()).error_code == 0

    return {
        "ApiVersions on a connection made before": lambda: steady.call(api_versions_request()),
        "ApiVersions on a new connection": new_connection,
    }


def _produce(broker: EmbeddedBroker, topic: str, timeout: float = ROUND_TRIP_TIMEOUT) -> None:
    """One Produce of about 900 KiB on a new connection: it arrives in several reads."""
    batch = good_batch([b"v" * (300 << 10)] * 3)
    with WireClient(broker.bootstrap, timeout=timeout) as client:
        response = client.call(produce_request(topic, {0: batch}))
    assert response.responses[0].partition_responses[0].error_code == 0


def test_huge_frames_announced_and_trickled_do_not_freeze_the_broker(
    make_broker: MakeBroker, topic_name: str
) -> None:
    broker = make_broker()  # queued.max.request.bytes: 200 MiB
    create_topic(broker.bootstrap, topic_name)
    steady = WireClient(broker.bootstrap, timeout=ROUND_TRIP_TIMEOUT)
    actions = _small_requests(broker, steady)
    actions["Produce of 900 KiB"] = lambda: _produce(broker, topic_name)
    with Victims(actions) as victims:
        attackers = [WireClient(broker.bootstrap) for _ in range(4)]
        trickle_while_served(victims, attackers, size_prefix(100 * MiB))
    steady.close()
    print(victims.report())
    victims.assert_served_within(1.0)


def _send_until_stalled(socks: list[socket.socket], data: bytes) -> None:
    """Push `data` down each socket, round robin, until the broker takes no more."""
    views = [memoryview(data) for _ in socks]
    for sock in socks:
        sock.setblocking(False)
    last_progress = time.monotonic()
    while time.monotonic() - last_progress < 1.0 and any(views):
        for i, sock in enumerate(socks):
            if not views[i]:
                continue
            try:
                n = sock.send(views[i][: 1 << 20])
            except BlockingIOError:
                continue
            views[i] = views[i][n:]
            last_progress = time.monotonic()
        time.sleep(0.005)
    for sock in socks:
        sock.setblocking(True)


def test_a_pool_used_up_by_partial_frames_still_serves_others(
    make_broker: MakeBroker, topic_name: str
) -> None:
    """Four clients send 40 MiB each of 100 MiB frames, using up a 32 MiB pool with real
    bytes, then trickle. Requests that arrive whole are served throughout; the one sender
    reading on past the pool (its lane) is closed for stalling, which frees the pool."""
    pool = 32 * MiB
    # idle expiry out of the way: it is not what must free the pool
    broker = make_broker(
        settings={"queued.max.request.bytes": str(pool), "connections.max.idle.ms": "600000"},
        log_level="INFO",
    )
    create_topic(broker.bootstrap, topic_name)
    wait_quiet(broker)
    baseline = broker.rss_bytes()
    steady = WireClient(broker.bootstrap, timeout=ROUND_TRIP_TIMEOUT)
    senders = [WireClient(broker.bootstrap) for _ in range(4)]
    with Victims(_small_requests(broker, steady)) as victims:
        victims.wait_rounds(2)
        for sender in senders:
            sender.send_raw(struct.pack(">i", 100 * MiB))
        _send_until_stalled([s.sock for s in senders], bytes(40 * MiB))
        held = broker.rss_bytes() - baseline
        attack = Trickler(senders, b"")  # already inside their frames
        try:
            started = victims.rounds
            victims.wait_rounds(started + 10)
            wait_for(
                lambda: attack.closed,
                30,
                "the broker to close the sender that holds the pool's lane and stalls",
            )
            _produce(broker, topic_name, timeout=30)  # a request of several reads: served
        finally:
            attack.stop()
    steady.close()
    print(victims.report(), f"; {held / MiB:.0f} MiB held while the pool was used up")
    # the pool, plus what the lane read past it, plus a read per connection
    assert held < pool + 100 * MiB, f"{held / MiB:.0f} MiB held"
    wait_for_line(broker, "request memory pool", 30, "the broker to log the pool used up")
    victims.assert_served_within(1.0)
