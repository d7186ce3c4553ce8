"""An offset commit's expire timestamp (commit time + the request's retention time, OffsetCommit
v2-v4) is stored as an int64 in `__consumer_offsets`: a retention of Long.MAX_VALUE saturates
there (still "never expires") instead of failing the record's encoding."""

from __future__ import annotations

from onceflow.groups.config import GroupCoordinatorConfig
from onceflow.groups.offsets import OffsetAndMetadata
from onceflow.records.varint import INT64_MAX

from .harness import Env

TP = ("orders", 0)


def test_a_retention_of_long_max_saturates_the_expire_timestamp() -> None:
    env = Env(offsets_retention_ms=1_000)
    result = env.coord.commit_offsets(
        "g", -1, "", None, {TP: OffsetAndMetadata(7)}, retention_time_ms=INT64_MAX
    )
    env.write(result.records)  # replays the encoded records, as a restart would
    assert env.coord.offsets.get("g", TP).expire_timestamp_ms == INT64_MAX
    # offsets.retention.ms has long passed: the commit's own retention keeps it
    env.clock.advance(10_000_000)
    assert env.coord.cleanup_expired_offsets().records == []


def test_offsets_retention_minutes_in_ms_saturates() -> None:
    config = GroupCoordinatorConfig.from_properties({"offsets.retention.minutes": str(INT64_MAX)})
    assert config.offsets_retention_ms == INT64_MAX
