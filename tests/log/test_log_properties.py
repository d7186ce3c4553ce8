"""Random appends, rolls, flushes and reopens (clean and crashed) against a simple model."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_batches import batches, make_batch, split_batches, stored

from onceflow.clock import ManualClock
from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=64, segment_index_bytes=120)

append_op = st.tuples(
    st.just("append"),
    st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), min_size=1, max_size=3),
)
ops = st.lists(
    st.one_of(
        append_op,
        append_op,
        append_op,
        st.just(("roll",)),
        st.just(("flush",)),
        st.just(("reopen",)),
        st.just(("crash",)),
    ),
    min_size=1,
    max_size=40,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, seed=st.integers(0, 2**32 - 1))
def test_offsets_stay_contiguous_and_reads_return_what_was_appended(tmp_path_factory, ops, seed):
    directory = tmp_path_factory.mktemp("prop") / "p"
    clock = ManualClock()
    log = PartitionLog.open(directory, CONFIG, clock)
    model: list[tuple[int, int, bytes]] = []  # (first, last, stored bytes)
    try:
        for op in ops:
            clock.advance(7)
            if op[0] == "append":
                raws = [make_batch(n, timestamp=clock.now_ms, value=b"z" * v) for n, v in op[1]]
                epoch = len(model) % 3
                info = log.append(*batches(*raws), leader_epoch=epoch)
                expected_first = model[-1][1] + 1 if model else 0
                assert info.first_offset == expected_first
                offset = info.first_offset
                for raw, (_, header) in zip(raws, info.headers, strict=True):
                    assert header.base_offset == offset
                    model.append((offset, header.last_offset, stored(raw, offset, epoch)))
                    offset = header.last_offset + 1
                assert info.last_offset == offset - 1 == log.log_end_offset - 1
            elif op[0] == "roll":
                log.roll()
            elif op[0] == "flush":
                ticket = log.prepare_flush()
                if ticket is not None:
                    ticket.run()
                    log.complete_flush(ticket)
                assert log.flushed_offset == log.log_end_offset
            elif op[0] == "reopen":
                log.close()
                log = PartitionLog.open(directory, CONFIG, clock)
            else:
                log._abandon()
                log = PartitionLog.open(directory, CONFIG, clock)
            check(log, model, random.Random(seed))
    finally:
        log._abandon()


def check(log: PartitionLog, model: list[tuple[int, int, bytes]], rng: random.Random) -> None:
    end = model[-1][1] + 1 if model else 0
    assert (log.log_start_offset, log.log_end_offset) == (0, end)
    bases = log.segment_base_offsets
    assert bases == sorted(set(bases)) and bases[0] == 0
    firsts = {first for first, _, _ in model} | {end}
    assert all(b in firsts for b in bases[1:])  # segments start at batch boundaries
    everything = log.read(0, 1 << 24)
    assert everything.data == b"".join(raw for _, _, raw in model)
    assert everything.next_offset == end
    assert [h.base_offset for h in split_batches(everything.data)] == [f for f, _, _ in model]
    if model:
        first, last, raw = model[rng.randrange(len(model))]
        offset = rng.randint(first, last)
        assert log.read(offset, 1).data == raw
        bound = rng.randint(0, end)
        bounded = log.read(0, 1 << 24, max_offset=bound).data
        assert bounded == b"".join(r for f, _, r in model if f < bound)
