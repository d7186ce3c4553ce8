"""Simulated clients: each instance is a generator that yields requests and is sent answers.

The driver (the scheduler) delivers each request, or loses it, and re-sends the same request
when the client times out, as Kafka clients do; a program never sees a lost message, only an
answer. A producer program follows the Java client's state machine in its essentials:
- retriable errors (CONCURRENT_TRANSACTIONS, NOT_ENOUGH_REPLICAS, ...) are retried as they are;
- fatal errors (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, ...) end
  the instance: a new instance takes over (InitProducerId without producer id and epoch);
- other errors inside a transaction abort it, then InitProducerId with the current producer id
  and epoch bumps the epoch (KIP-360), so that sequences restart cleanly.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.records.builder import build_batch
from onceflow.simulation.checker import Checker, encode_value
from onceflow.simulation.messages import (
    AddOffsets,
    AddPartitions,
    Answer,
    EndTxn,
    InitProducerId,
    Produce,
    TopicPartition,
    TxnOffsetCommit,
    TxnRecord,
)

Program = Generator[object, Answer, None]

RETRIABLE = frozenset(
    {
        ErrorCode.concurrent_transactions,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.not_enough_replicas,
        ErrorCode.request_timed_out,
    }
)
FATAL = frozenset(
    {
        ErrorCode.producer_fenced,
        ErrorCode.invalid_producer_epoch,
        ErrorCode.invalid_producer_id_mapping,
        ErrorCode.transactional_id_not_found,
        ErrorCode.transactional_id_authorization_failed,
    }
)
INPUT_PARTITION: TopicPartition = ("input", 0)


class Fatal(Exception):
    """The instance is done for: the broker fenced it or forgot its producer id."""


class Abortable(Exception):
    """The transaction cannot commit: abort it and start again with a bumped epoch."""


@dataclass
class ClientContext:
    """What every program shares: the randomness, the books, and the workload's shape."""

    rng: random.Random
    checker: Checker
    partitions: list[TopicPartition]
    txn_timeout_ms: int
    abort_ratio: float
    stopping: bool = False
    next_input_offset: dict[str, int] = field(default_factory=dict)

    def batch_values(
        self, client: str, tp: TopicPartition, txn: TxnRecord | None
    ) -> tuple[int, ...]:
        count = self.rng.randint(1, 3)
        return tuple(self.checker.new_value(client, tp, txn) for _ in range(count))


@dataclass
class ClientState:
    """One client application; its instances come and go."""

    name: str
    transactional_id: str | None
    group: str | None = None
    unexpected: list[str] = field(default_factory=list)
    # 2: a transactions version 2 client (KIP-890 part 2), as Kafka's Java producer 4.x
    transaction_version: int = 0


@dataclass
class InstanceState:
    """One instance: set `zombie` to make it finish its transaction and stop."""

    zombie: bool = False
    current_txn: TxnRecord | None = None


def _batch(
    values: tuple[int, ...],
    producer_id: int,
    epoch: int,
    sequence: int,
    transactional: bool,
    now: int,
) -> bytes:
    return build_batch(
        [(None, encode_value(v), (), now) for v in values],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        transactional=transactional,
    )


def _call(request: object) -> Generator[object, Answer, Answer]:
    """Send until the answer is not retriable."""
    while True:
        answer = yield request
        if answer.error not in RETRIABLE:
            return answer


def _check(answer: Answer, state: ClientState, what: str) -> None:
    if answer.error == ErrorCode.none:
        return
    if answer.error in FATAL:
        raise Fatal(f"{what}: {answer.error.name}")
    state.unexpected.append(f"{what}: {answer.error.name}")
    raise Abortable(f"{what}: {answer.error.name}")


def transactional_program(
    ctx: ClientContext, state: ClientState, clock: object, instance: InstanceState
) -> Program:
    """A transactional producer; with `state.group` a consume-transform-produce copier that
    commits an input offset in each transaction."""
    txn_id = state.transactional_id
    assert txn_id is not None
    producer_id, epoch = -1, -1
    while True:
        answer = yield from _call(InitProducerId(txn_id, ctx.txn_timeout_ms, producer_id, epoch))
        if answer.error != ErrorCode.none:
            return  # fenced (or unexpected): this instance is done
        producer_id, epoch = answer.value
        sequences: dict[TopicPartition, int] = {}
        while not (ctx.stopping or instance.zombie):
            txn = TxnRecord(
                len(ctx.checker.txns),
                txn_id,
                producer_id,
                epoch,
                transaction_version=state.transaction_version,
            )
            ctx.checker.txns.append(txn)
            instance.current_txn = txn
            v2 = state.transaction_version
            try:
                bumped = yield from _transaction(
                    ctx, state, txn, producer_id, epoch, sequences, clock
                )
            except Fatal:
                txn.outcome = "unknown" if txn.commit_sent else "aborted"
                return
            except Abortable:
                txn.outcome = "unknown" if txn.commit_sent else "aborted"
                if txn.commit_sent:
                    return
                txn.end_sent = True
                answer = yield from _call(EndTxn(txn_id, producer_id, epoch, False, txn, v2))
                if answer.error != ErrorCode.none:
                    return
                if v2 < 2:
                    break  # re-initialize: InitProducerId with the current id and epoch
                bumped = answer.value  # version 2: the abort bumped the epoch
            finally:
                instance.current_txn = None
            if bumped is not None and tuple(bumped) != (producer_id, epoch):
                # Version 2: the next transaction has the new epoch (or producer id), and its
                # sequences start again from 0.
                producer_id, epoch = bumped
                sequences.clear()
        else:
            return


def _transaction(
    ctx: ClientContext,
    state: ClientState,
    txn: TxnRecord,
    producer_id: int,
    epoch: int,
    sequences: dict[TopicPartition, int],
    clock: object,
) -> Generator[object, Answer, tuple[int, int] | None]:
    """One transaction; returns the producer id and epoch an EndTxn v5 answered (version 2)."""
    txn_id = txn.transactional_id
    rng = ctx.rng
    v2 = state.transaction_version
    chosen = rng.sample(ctx.partitions, rng.randint(1, min(3, len(ctx.partitions))))
    if v2 < 2:  # version 2: Produce v12 adds each partition
        answer = yield from _call(AddPartitions(txn_id, producer_id, epoch, tuple(sorted(chosen))))
        _check(answer, state, "AddPartitionsToTxn")
    for tp in chosen:
        for _ in range(rng.randint(1, 2)):
            values = ctx.batch_values(state.name, tp, txn)
            sequence = sequences.get(tp, 0)
            data = _batch(values, producer_id, epoch, sequence, True, clock())  # type: ignore[operator]
            answer = yield from _call(Produce(txn_id, tp, data, values, v2))
            _check(answer, state, f"Produce {tp}")
            sequences[tp] = sequence + len(values)
            for i, value in enumerate(values):
                ctx.checker.values[value].acked_offset = answer.value + i
                txn.values.append(value)
    if state.group is not None:
        group = state.group
        if v2 < 2:  # version 2: TxnOffsetCommit v5 adds the offsets partition
            answer = yield from _call(AddOffsets(txn_id, producer_id, epoch, group))
            _check(answer, state, "AddOffsetsToTxn")
        offset = ctx.next_input_offset.get(group, 0) + 1
        ctx.next_input_offset[group] = offset
        txn.offsets[group] = offset
        ctx.checker.offset_owner[(group, offset)] = txn
        answer = yield from _call(
            TxnOffsetCommit(
                txn_id, producer_id, epoch, group, ((INPUT_PARTITION, offset),), txn, v2
            )
        )
        _check(answer, state, "TxnOffsetCommit")
    commit = rng.random() >= ctx.abort_ratio
    txn.commit_sent = txn.commit_sent or commit
    txn.end_sent = True
    answer = yield from _call(EndTxn(txn_id, producer_id, epoch, commit, txn, v2))
    _check(answer, state, "EndTxn")
    txn.outcome = "committed" if commit else "aborted"
    return answer.value if v2 >= 2 else None


def idempotent_program(
    ctx: ClientContext, state: ClientState, clock: object, instance: InstanceState
) -> Program:
    """An idempotent (acks=all) producer; any error but a retriable one ends the instance,
    and the next one gets a new producer id."""
    answer = yield from _call(InitProducerId(None, ctx.txn_timeout_ms))
    if answer.error != ErrorCode.none:
        state.unexpected.append(f"InitProducerId: {answer.error.name}")
        return
    producer_id, epoch = answer.value
    sequences: dict[TopicPartition, int] = {}
    while not (ctx.stopping or instance.zombie):
        tp = ctx.rng.choice(ctx.partitions)
        values = ctx.batch_values(state.name, tp, None)
        sequence = sequences.get(tp, 0)
        data = _batch(values, producer_id, epoch, sequence, False, clock())  # type: ignore[operator]
        answer = yield from _call(Produce(None, tp, data, values))
        if answer.error != ErrorCode.none:
            state.unexpected.append(f"Produce {tp}: {answer.error.name}")
            return
        sequences[tp] = sequence + len(values)
        for i, value in enumerate(values):
            ctx.checker.values[value].acked_offset = answer.value + i
