"""What a confluent-kafka exception carries, and asking again while a cluster is away.

librdkafka raises KafkaException with its KafkaError as the first argument; these read it
without assuming it is there. `retry_transient` is the inner loop of every driver-side look-up
that waits out a restarting broker: each caller says what is transient and for how long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import TypeVar

from confluent_kafka import KafkaError

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError an exception carries, if any."""
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


def kafka_error_code(exc: BaseException) -> int | None:
    """The code of the KafkaError an exception carries, if any."""
    error = kafka_error(exc)
    return None if error is None else error.code()


def retriable(exc: BaseException, also: Collection[int] = ()) -> bool:
    """The client marks the error retriable, or its code is one of `also`."""
    error = kafka_error(exc)
    return error is not None and (error.retriable() or error.code() in also)


# The group coordinator moving (its node killed or restarted, __consumer_offsets made or its
# leader elected): librdkafka raises these from committed() rather than asking the new
# coordinator, where Java's consumer asks again until its timeout.
COORDINATOR_MOVING = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError._TRANSPORT,
)


def coordinator_moving(exc: Exception) -> bool:
    """A group look-up worth asking again: the group's coordinator is moving or away."""
    return retriable(exc, COORDINATOR_MOVING)


def retry_transient(
    call: Callable[[], _T],
    transient: Callable[[Exception], bool],
    *,
    within_s: float,
    backoff_s: float,
    what: str,
    level: int = logging.DEBUG,
) -> _T:
    """`call()`, asked again `backoff_s` after each failure `transient` accepts, for up to
    `within_s`; any other failure, or the last one at the deadline, is raised."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except Exception as exc:
            if not transient(exc) or time.monotonic() >= deadline:
                raise
            log.log(level, "%s: %s; asking again", what, exc)
            time.sleep(backoff_s)
