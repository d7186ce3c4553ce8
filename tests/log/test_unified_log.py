"""The partition's log as Kafka's UnifiedLog: `read` owns the read rules (the isolation bound,
KIP-74's first batch, the aborted transactions), the append takes the coordinator's answers in a
VerificationGuard and never asks the coordinator, and nothing outside the log reaches into it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.clock import ManualClock
from onceflow.log.config import LogConfig
from onceflow.log.errors import OffsetOutOfRangeError
from onceflow.log.producer_errors import InvalidProducerEpochError
from onceflow.log.unified_log import FetchIsolation, UnifiedLog
from onceflow.log.verification_guard import VerificationGuard
from onceflow.records.batch import iter_batches
from onceflow.records.builder import build_batch
from onceflow.records.validation import AppendRefused

SRC = Path(__file__).resolve().parents[2] / "src" / "onceflow"
PID = 7
COMMITTED, UNCOMMITTED = FetchIsolation.TXN_COMMITTED, FetchIsolation.HIGH_WATERMARK


@pytest.fixture
def log(tmp_path: Path) -> Iterator[UnifiedLog]:
    unified = UnifiedLog.open("t", 0, tmp_path / "t-0", LogConfig(), ManualClock(1000), 86_400_000)
    yield unified
    unified.close()


def _produce(
    log: UnifiedLog, guard: VerificationGuard | None, *, seq: int = 0, txn: bool = True
) -> int:
    data = build_batch(
        [(b"k", b"v" * 100, (), 1000)],
        producer_id=PID if guard is not None else -1,
        producer_epoch=0 if guard is not None else -1,
        base_sequence=seq if guard is not None else -1,
        transactional=txn and guard is not None,
    )
    return log.append_as_leader(data, log.validate(data), guard).first_offset


def _flush(log: UnifiedLog) -> None:
    log.log.complete_flush(log.log.prepare_flush())


def _offsets(records: bytes) -> list[int]:
    return [h.base_offset for _, h in iter_batches(records, verify_crc=False)]


def test_read_committed_stops_at_the_last_stable_offset_with_the_aborted_transactions(
    log: UnifiedLog,
) -> None:
    _produce(log, VerificationGuard(transactional_id="tx"))
    log.append_marker(PID, 0, False, 0, 1000)  # aborted: offsets 0 and its marker at 1
    _produce(log, VerificationGuard(transactional_id="tx"), seq=1)  # open at 2
    _produce(log, None)  # 3, plain
    assert log.read(0, 1 << 20, COMMITTED, min_one=True).records == b""  # nothing durable yet
    _flush(log)
    committed = log.read(0, 1 << 20, COMMITTED, min_one=True)
    assert (committed.high_watermark, committed.last_stable_offset) == (4, 2)
    assert _offsets(committed.records) == [0, 1]
    assert committed.aborted_transactions == [(PID, 0)]
    uncommitted = log.read(0, 1 << 20, UNCOMMITTED, min_one=True)
    assert _offsets(uncommitted.records) == [0, 1, 2, 3]
    assert uncommitted.aborted_transactions is None


def test_a_version_2_marker_must_bump_the_epoch_of_the_partitions_batches(
    log: UnifiedLog,
) -> None:
    """As Kafka's leader (ProducerAppendInfo.checkProducerEpoch): a marker of a transactions
    version 2 transaction carries the epoch its EndTxn bumped, so one at the batches' epoch is
    a late marker of an earlier transaction and is refused, writing nothing; versions 0/1
    accept it. A retry of a version 2 marker already written is accepted."""
    _produce(log, VerificationGuard(transactional_id="tx"))  # open at epoch 0
    end = log.log_end_offset
    with pytest.raises(InvalidProducerEpochError) as refused:
        log.append_marker(PID, 0, True, 0, 1000, transaction_version=2)
    assert refused.value.error_code == ErrorCode.invalid_producer_epoch
    assert log.log_end_offset == end
    assert log.producers.has_ongoing_transaction(PID, 0)
    log.append_marker(PID, 0, True, 0, 1000, transaction_version=1)
    assert not log.producers.has_ongoing_transaction(PID, 0)
    # The next transaction, at epoch 0 again (a version 0/1 client keeps its epoch), ends with
    # a version 2 marker that bumps it; its retry at that epoch writes a second marker.
    _produce(log, VerificationGuard(transactional_id="tx"), seq=1)
    log.append_marker(PID, 1, False, 0, 1000, transaction_version=2)
    log.append_marker(PID, 1, False, 0, 1000, transaction_version=2)
    assert log.log_end_offset == end + 4
    with pytest.raises(InvalidProducerEpochError):
        log.append_marker(PID, 0, False, 0, 1000, transaction_version=2)


def test_only_the_first_batch_of_a_response_may_exceed_max_bytes(log: UnifiedLog) -> None:
    _produce(log, None)
    _flush(log)
    assert _offsets(log.read(0, 10, UNCOMMITTED, min_one=True).records) == [0]  # KIP-74
    assert log.read(0, 10, UNCOMMITTED, min_one=False).records == b""
    assert log.read(0, 0, UNCOMMITTED, min_one=False).records == b""


def test_a_read_outside_the_log_is_out_of_range(log: UnifiedLog) -> None:
    _produce(log, None)
    _flush(log)
    assert log.read(1, 100, UNCOMMITTED, min_one=True).records == b""  # the end: nothing yet
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100, UNCOMMITTED, min_one=True)


def test_the_append_takes_the_coordinators_verdict_and_writes_nothing_on_a_refusal(
    log: UnifiedLog,
) -> None:
    refused = VerificationGuard(ErrorCode.invalid_producer_epoch, "tx")
    with pytest.raises(AppendRefused) as e:
        _produce(log, refused)
    assert (e.value.code, e.value.verification) == (ErrorCode.invalid_producer_epoch, True)
    # a transactional producer's id may not write outside a transaction
    with pytest.raises(AppendRefused) as e:
        _produce(log, VerificationGuard(transactional_producer=True), txn=False)
    assert e.value.code == ErrorCode.invalid_txn_state
    assert log.log.log_end_offset == 0
    with pytest.raises(ValueError, match="guard"):
        data = build_batch(
            [(b"k", b"v", (), 1000)], producer_id=PID, producer_epoch=0, base_sequence=0
        )
        log.append_as_leader(data, log.validate(data), None)


def _attribute_uses(tree: ast.AST) -> set[str]:
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def test_nothing_outside_the_log_reaches_into_it() -> None:
    """Its users (the Fetch and Produce paths, the simulation) call public methods only, the log
    never imports the transaction coordinator, and the connection does not import a handler."""
    own = SRC / "log" / "unified_log.py"
    private = {
        node.attr
        for node in ast.walk(ast.parse(own.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and isinstance(node.value, ast.Name)
        and node.value.id in ("self", "unified", "cls")
    }
    assert {"_replay_from", "_segments_seen"} <= private
    users = [*(SRC / "simulation").glob("*.py"), *(SRC / "broker").rglob("*.py")]
    reached = {
        str(path.relative_to(SRC)): sorted(_attribute_uses(ast.parse(path.read_text())) & private)
        for path in users
    }
    assert not {path: names for path, names in reached.items() if names}
    for path in (SRC / "log").glob("*.py"):
        text = path.read_text()
        assert "onceflow.txn" not in text and "onceflow.broker" not in text, path
    connection = ast.parse((SRC / "broker" / "connection.py").read_text())
    imported = {n.module for n in ast.walk(connection) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and ".handlers" in m}
