"""`onceflow verify --embedded --group-protocol consumer`: the copiers in a KIP-848 group,
with the broker killed and clients crashed, and no anomaly."""

from __future__ import annotations

from pathlib import Path

from tests.verify.runs import assert_clean, run_verify


def test_verify_copiers_in_a_consumer_protocol_group(tmp_path: Path) -> None:
    kinds = ("kill", "crash-client")
    report, _ = run_verify(
        tmp_path,
        *("--duration", "20s", "--faults", ",".join(kinds), "--seed", "5"),
        *("--group-protocol", "consumer"),
        timeout=200,
    )
    operations = assert_clean(report, kinds)
    assert operations["copy_transactions"] >= 10, operations
    assert report["details"]["copiers_drained"]  # all committed input was copied
    assert report["details"]["copy_group_type"] == "consumer"  # as the broker lists it
