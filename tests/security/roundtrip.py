"""Produce a few records and read them back, with each client library, over any listener."""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

RECORDS = [f"record-{i}".encode() for i in range(3)]
TIMEOUT_S = 30.0


def topic() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"


def confluent_round_trip(config: dict[str, Any]) -> list[bytes]:
    name = topic()
    producer = Producer({**config, "enable.idempotence": True})
    for value in RECORDS:
        producer.produce(name, value)
    assert producer.flush(TIMEOUT_S) == 0, "records not delivered"
    consumer = Consumer(
        {**config, "group.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([name])
    try:
        got: list[bytes] = []
        for message in _poll_until(consumer, len(RECORDS)):
            got.append(message.value())
        return got
    finally:
        consumer.close()


def _poll_until(consumer: Consumer, count: int) -> list[Any]:
    import time

    deadline = time.monotonic() + TIMEOUT_S
    out: list[Any] = []
    while len(out) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            out.append(message)
    return out


def kafka_python_round_trip(bootstrap: str, **security: Any) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer

    name = topic()
    producer = KafkaProducer(bootstrap_servers=bootstrap, **security)
    for value in RECORDS:
        producer.send(name, value)
    producer.flush(TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(
        name,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(TIMEOUT_S * 1000),
        **security,
    )
    try:
        got = []
        for message in consumer:
            got.append(message.value)
            if len(got) == len(RECORDS):
                break
        return got
    finally:
        consumer.close()


def aiokafka_round_trip(bootstrap: str, ca: Path | None, **security: Any) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[bytes]:
        name = topic()
        if ca is not None:
            security["ssl_context"] = ssl.create_default_context(cafile=str(ca))
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **security)
        await producer.start()
        try:
            for value in RECORDS:
                await producer.send_and_wait(name, value)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            name, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **security
        )
        await consumer.start()
        try:
            got: list[bytes] = []
            async with asyncio.timeout(TIMEOUT_S):
                async for message in consumer:
                    got.append(message.value)
                    if len(got) == len(RECORDS):
                        break
            return got
        finally:
            await consumer.stop()

    return asyncio.run(run())
