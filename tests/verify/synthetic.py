"""Generated verify histories: many transactions over a few partitions, each commit or abort
marker a gap in the read_committed readers' offsets, consumers reading it all, copiers (of
every committed record of the first partitions), the
final passes, and optionally anomalies planted in what the consumers saw. The checker's
timing is measured on one the size of a 1-hour `onceflow verify --faults all` run, and its
findings are compared with the old (quadratic) checker's on small ones.

    python -m tests.verify.synthetic  # the 1-hour-run size: time the checker
"""

from __future__ import annotations

import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

from onceflow.verify.history import ABORT, COMMIT, FAIL, OK, READ_COMMITTED, READ_UNCOMMITTED, Op
from onceflow.verify.workload import COPY_MARK
from tests.verify.histories import Placed, Scenario

TOPIC, OUT = "verify-in", "verify-out"
ANOMALIES = ("drop", "swap", "phantom", "flip", "duplicate", "stray", "offsets", "hang")


@dataclass(frozen=True)
class Shape:
    """How big a generated history is, and how many anomalies are planted in it."""

    committed: int = 33_000  # and about 13,000 copy transactions: 46,000 in all
    aborted: int = 12_900
    partitions: int = 6
    producers: int = 3
    max_writes: int = 4
    readers: int = 16  # read_committed readers (each reads every committed record)
    uncommitted_readers: int = 1
    copied_partitions: int = 1  # the copiers copy every committed record of these
    poll_size: int = 500
    anomalies: int = 0


def generate(shape: Shape, seed: int = 0) -> list[Op]:
    """A history of `shape` (consistent when shape.anomalies is 0)."""
    rng = random.Random(seed)
    s = Scenario()
    s.topics({TOPIC: (shape.partitions, {}), OUT: (1, {})})
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    committed: dict[tuple[str, int], list[Placed]] = defaultdict(list)
    uncommitted: dict[tuple[str, int], list[Placed]] = defaultdict(list)
    outcomes = [OK] * shape.committed + [FAIL] * shape.aborted
    rng.shuffle(outcomes)
    copied: list[Placed] = []
    for n, outcome in enumerate(outcomes):
        producer = f"p{n % shape.producers}"
        placed: list[Placed] = []
        for i in range(rng.randint(1, shape.max_writes)):
            tp = (TOPIC, rng.randrange(shape.partitions))
            placed.append((*tp, next_offset[tp], f"{producer}.{n}.{i}"))
            next_offset[tp] += 1
        for tp in {(t, p) for t, p, _, _ in placed}:
            next_offset[tp] += 1  # the commit or abort marker
        intent = ABORT if outcome == FAIL and rng.random() < 0.5 else COMMIT
        s.txn(f"{producer}#1", f"{producer}.{n}", placed, outcome, intent=intent)
        for t, p, o, v in placed:
            uncommitted[(t, p)].append((t, p, o, v))
            if outcome == OK:
                committed[(t, p)].append((t, p, o, v))
        if outcome == OK:
            copied += [r for r in placed if r[1] < shape.copied_partitions]
    # The copiers: one copy transaction per copied input, the group offset past it.
    copy_offset = 0
    group: dict[tuple[str, int], int] = {}
    for k, (t, p, o, v) in enumerate(copied):
        out = (OUT, 0, copy_offset, f"{v}{COPY_MARK}c.{k}")
        group[(t, p)] = o + 1
        s.txn("c#1", f"c.{k}", [out], OK, reads=[(t, p, o, v)], offsets=[(t, p, o + 1)])
        committed[(OUT, 0)].append(out)
        uncommitted[(OUT, 0)].append(out)
        copy_offset += 2
        next_offset[(OUT, 0)] = copy_offset
    readers = [f"rc{i}#1" for i in range(shape.readers)]
    readers += [f"ru{i}#1" for i in range(shape.uncommitted_readers)]
    streams = {
        reader: _interleave(
            rng, committed if reader.startswith("rc") else uncommitted, shape.poll_size
        )
        for reader in readers
    }
    final_group = {tp: o for tp, o in group.items()}
    for _ in range(shape.anomalies):
        _plant(rng, rng.choice(ANOMALIES), streams, committed, final_group)
    for reader, polls in streams.items():
        isolation = READ_COMMITTED if reader.startswith("rc") else READ_UNCOMMITTED
        for batch in polls:
            s.poll(reader, batch, isolation)
    s.offsets("offsets#1", sorted((t, p, o) for (t, p), o in group.items()))
    ends = dict(next_offset)
    final_committed = [r for records in committed.values() for r in records]
    s.final(READ_COMMITTED, final_committed, ends, _hung(final_group, ends))
    s.final(READ_UNCOMMITTED, [r for records in uncommitted.values() for r in records], ends)
    s.final_offsets(sorted((t, p, o) for (t, p), o in final_group.items() if o >= 0))
    return s.ops


def _interleave(
    rng: random.Random, logs: dict[tuple[str, int], list[Placed]], size: int
) -> list[list[Placed]]:
    """Polls of up to `size` records, each from the partitions in turn, in offset order."""
    cursors = {tp: 0 for tp in logs}
    polls = []
    while cursors:
        batch: list[Placed] = []
        for tp in list(cursors):
            take = rng.randint(1, max(1, size // len(logs)))
            batch += logs[tp][cursors[tp] : cursors[tp] + take]
            cursors[tp] += take
            if cursors[tp] >= len(logs[tp]):
                del cursors[tp]
        polls.append(batch)
    return polls


def _plant(
    rng: random.Random,
    kind: str,
    streams: dict[str, list[list[Placed]]],
    committed: dict[tuple[str, int], list[Placed]],
    final_group: dict[tuple[str, int], int],
) -> None:
    """One anomaly in what a reader saw (or in the final state)."""
    polls = streams[rng.choice(sorted(streams))]
    batch = rng.choice(polls)
    if not batch:
        return
    i = rng.randrange(len(batch))
    t, p, o, v = batch[i]
    if kind == "drop":  # poll-skip, torn-transaction
        del batch[i]
    elif kind == "swap" and i + 1 < len(batch):  # nonmonotonic-poll
        batch[i], batch[i + 1] = batch[i + 1], batch[i]
    elif kind == "phantom":  # phantom-read
        batch.insert(i, (t, p, o, f"ghost.{rng.randrange(1 << 30)}"))
    elif kind == "duplicate":  # duplicate, inconsistent-offset
        batch.append((t, p, o + 1_000_000, v))
    elif kind == "stray":  # phantom-read: a value in another partition
        batch[i] = (t, p + 100, o, v)
    elif kind == "flip":  # a committed value missing from the final read: lost-write
        tp = (t, p)
        if committed.get(tp):
            committed[tp].pop(rng.randrange(len(committed[tp])))
    elif kind == "offsets" and final_group:  # phantom-offsets, lost-write of copies
        tp = rng.choice(sorted(final_group))
        final_group[tp] += rng.randint(1, 3)
    elif kind == "hang" and final_group:
        tp = rng.choice(sorted(final_group))
        final_group[tp] = -1 - final_group[tp]  # marks the partition's final pass as short


def _hung(
    final_group: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """The final read_committed positions: short of the end where an anomaly said so."""
    positions = {}
    for tp, o in list(final_group.items()):
        if o < 0:
            final_group[tp] = -1 - o
            positions[tp] = ends[tp] - 1
    return positions


def main() -> None:
    from onceflow.verify.checker import Checker

    started = time.perf_counter()
    ops = generate(Shape())
    made = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    result = Checker(ops).run()
    took, cpu = time.perf_counter() - started, time.process_time() - cpu
    s = result.stats
    print(
        f"history: {len(ops)} operations ({made:.1f} s to make), {s['committed']} committed "
        f"and {s['aborted']} aborted transactions, {s['polls_records']} records read; "
        f"checked in {took:.1f} s ({cpu:.1f} s of CPU), {len(result.anomalies)} anomalies",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
