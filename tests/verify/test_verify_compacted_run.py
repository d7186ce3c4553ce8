"""`onceflow verify --embedded --workload compacted` for real, with every fault kind: keyed
transactional producers on a compacted topic that the cleaner cleans many times during the run;
zero anomalies, and the same history, tampered with, is flagged by each compaction check (they
are not vacuous on real data)."""

from __future__ import annotations

from pathlib import Path

from onceflow.verify.checker import check
from onceflow.verify.faults import FAULT_KINDS
from onceflow.verify.history import FAIL, OK, TXN, History, Op
from tests.verify.runs import assert_clean, run_verify

# Seen: 36 rounds in a 40 s run with every fault, 27 in 20 s without (one round every ~1 s
# per the 200 ms backoff, the 16 KiB segments and the broker's pauses and restarts).
MIN_CLEANER_ROUNDS = 10


def test_verify_compacted_with_every_fault_finds_no_anomaly(tmp_path: Path) -> None:
    report, _ = run_verify(
        tmp_path,
        *("--workload", "compacted", "--duration", "40s", "--faults", "all", "--seed", "11"),
        *("--transaction-timeout-ms", "5000"),
        timeout=240,
    )
    operations = assert_clean(report, FAULT_KINDS)
    assert "last-value-lost" in report["anomalies"] and "offset-changed" in report["anomalies"]
    assert report["cleaner_rounds"] >= MIN_CLEANER_ROUNDS, report["details"]
    assert operations["keys"] == 24 and operations["keys_checked"] >= 20, operations
    assert operations["tombstones_written"] >= 10, operations
    # The cleaner removed, by the end, values the clients saw in the log: overwritten ones and
    # aborted ones (so the checks ran on a cleaned log, not on an untouched one).
    assert operations["cleaned_superseded"] >= 100, operations
    assert operations["cleaned_aborted"] >= 10, operations

    ops = History.load(Path(report["history"])).ops
    result = check(ops)
    assert result.valid
    tampered_last_value(ops)
    tampered_aborted_value(ops)
    tampered_offset(ops)


def final_records(ops: list[Op], process: str = "final-rc") -> list[list[object]]:
    return [r for o in ops if o.process == process and o.type == OK for r in o.value["records"]]


def keys_of(ops: list[Op]) -> dict[str, str]:
    return {
        v: k
        for o in ops
        if o.f == TXN and o.type == "invoke"
        for v, (k, _) in o.value.get("keys", {}).items()
    }


def forge(ops: list[Op], change: dict[str, list[list[object]]]) -> list[Op]:
    """The history with the final passes' records replaced (process -> records)."""
    out, done = [], set()
    for o in ops:
        if o.process in change and o.type == OK and o.f == "poll":
            records = [] if o.process in done else change[o.process]
            done.add(o.process)
            o = Op(o.index, o.time, o.process, o.type, o.f, {**o.value, "records": records})
        out.append(o)
    return out


def committed_final_value(ops: list[Op]) -> list[object]:
    """A record of the final read_committed pass written by an acknowledged transaction, the
    last of its key there (the log's tail, not cleaned yet, may hold older ones). Not a
    tombstone, nor of a key with a tombstone of unknown outcome: the cleaner may remove those,
    so their absence is no loss (the checker says so; a run whose first such record was a
    tombstone failed this test)."""
    outcome: dict[str, str] = {}  # value -> ok | fail of its transaction; absent: unknown
    invoked: dict[str, Op] = {}
    for o in ops:
        if o.f != TXN:
            continue
        if o.type == "invoke":
            invoked[o.process] = o
        elif (call := invoked.pop(o.process, None)) is not None and o.type in (OK, FAIL):
            outcome.update(dict.fromkeys(call.value.get("keys", {}), o.type))
    written = {
        v: (k, dead)
        for o in ops
        if o.f == TXN and o.type == "invoke"
        for v, (k, dead) in o.value.get("keys", {}).items()
    }
    doubtful = {k for v, (k, dead) in written.items() if dead and v not in outcome}
    last: dict[str, list[object]] = {}
    for record in final_records(ops):  # in offset order per partition; a key has one
        last[written[str(record[3])][0]] = record
    return next(
        r
        for key, r in last.items()
        if outcome.get(str(r[3])) == OK and not written[str(r[3])][1] and key not in doubtful
    )


def tampered_last_value(ops: list[Op]) -> None:
    """The final pass without a key's last committed value: last-value-lost for that key."""
    victim = committed_final_value(ops)
    kept = [r for r in final_records(ops) if r != victim]
    result = check(forge(ops, {"final-rc": kept}))
    lost = [a.to_json() for a in result.anomalies if a.kind == "last-value-lost"]
    assert [(x["key"], x["value"]) for x in lost] == [(keys_of(ops)[str(victim[3])], victim[3])]


def tampered_aborted_value(ops: list[Op]) -> None:
    """A value of an aborted transaction, cleaned away, shown by the final pass at its offset
    (as if cleaning had dropped the abort marker and kept the data): aborted-read."""
    final = {str(r[3]) for r in final_records(ops, "final-ru")}
    aborted = next(
        d
        for o in ops
        if o.f == TXN and o.type == FAIL
        for d in o.value.get("delivered", [])
        if d[3] not in final
    )
    records = sorted([*final_records(ops), aborted], key=lambda r: (r[0], r[1], r[2]))
    result = check(forge(ops, {"final-rc": records}))
    found = [a.to_json() for a in result.anomalies if a.kind == "aborted-read"]
    assert [(x["reader"], x["value"], x["offset"]) for x in found] == [
        ("final-rc", aborted[3], aborted[2])
    ]


def tampered_offset(ops: list[Op]) -> None:
    """A surviving record moved to another offset in both final passes: offset-changed."""
    victim = committed_final_value(ops)
    moved = [*victim[:2], int(str(victim[2])) + 1_000_000, victim[3]]
    change = {
        process: [moved if r == victim else r for r in final_records(ops, process)]
        for process in ("final-rc", "final-ru")
    }
    result = check(forge(ops, change))
    changed = [a.to_json() for a in result.anomalies if a.kind == "offset-changed"]
    assert [(x["value"], x["offset"]) for x in changed] == [(victim[3], moved[2])]
