"""The coordinator runtime's own duties, over in-memory logs and a manual timer: marker retries,
the held-request bound, markers in flight, a failed append."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from kio.schema.errors import ErrorCode
from tests.txn.coordinator_harness import SimulatedBroker

from onceflow.coordinator.runtime import CoordinatorUnavailableError

T0 = ("topic", 0)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.ERROR)  # the failures below are made on purpose
    yield
    logging.disable(logging.NOTSET)


def test_markers_whose_completion_fails_are_written_again_after_a_pause() -> None:
    broker = SimulatedBroker()
    producer = broker.new_producer("t")
    broker.add(producer, T0)
    assert broker.end(producer, True) == ErrorCode.none
    assert broker.runtime.markers_in_flight("t")
    broker.fail_appends = 1  # Complete* cannot be appended
    broker.write_markers()
    assert broker.state("t") == "PrepareCommit"
    assert [label for label, _ in broker.timers] == ["marker retry"]
    assert not broker.runtime.markers_in_flight("t")  # requests go on meanwhile
    _, retry = broker.timers.pop()
    retry()
    broker.write_markers()
    assert broker.state("t") == "CompleteCommit"
    assert [(topic, index) for topic, index, _ in broker.markers] == [T0, T0]  # written twice


def test_a_request_held_past_the_bound_is_answered_retriable_and_its_records_still_apply() -> None:
    broker = SimulatedBroker(hold=True)
    answers: list[object] = []
    broker.submit(broker.coordinator.init_producer_id("t", 60_000), answers.append, answers.append)
    assert answers == [] and broker.coordinator.has_pending("t")
    [(label, bound)] = broker.timers
    assert label == "held request"
    bound()
    [error] = answers
    assert isinstance(error, CoordinatorUnavailableError)
    assert error.error_code == ErrorCode.coordinator_not_available
    broker.release()  # durable after all: replayed, but not answered twice
    assert answers == [error]
    assert broker.state("t") == "Empty" and not broker.coordinator.has_pending("t")


def test_an_answer_in_time_cancels_the_bound() -> None:
    broker = SimulatedBroker(hold=True)
    answers: list[object] = []
    broker.submit(broker.coordinator.init_producer_id("t", 60_000), answers.append, answers.append)
    broker.release()
    assert [getattr(a, "error", None) for a in answers] == [ErrorCode.none]
    assert broker.timers == []


def test_waiters_on_markers_in_flight_are_called_when_they_end() -> None:
    broker = SimulatedBroker()
    producer = broker.new_producer("t")
    broker.add(producer, T0)
    broker.end(producer, False)
    done: list[str] = []
    broker.runtime.when_markers_done("t", lambda: done.append("t"))
    assert done == []
    broker.write_markers()
    assert done == ["t"] and broker.state("t") == "CompleteAbort"
    broker.runtime.when_markers_done("t", lambda: done.append("again"))  # none in flight
    assert done == ["t", "again"]


def test_a_failed_append_forgets_the_transition_and_reports_the_error() -> None:
    broker = SimulatedBroker()
    broker.fail_appends = 1
    failures: list[Exception] = []
    broker.submit(
        broker.coordinator.init_producer_id("t", 60_000), failures.append, failures.append
    )
    [failure] = failures
    assert isinstance(failure, CoordinatorUnavailableError)
    assert not broker.coordinator.has_pending("t") and broker.log == []
    assert len(broker.errors) == 1  # what the broker halts on if it is a storage failure
