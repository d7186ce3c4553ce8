from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from onceflow.clock import ManualClock
from onceflow.log.config import LogConfig
from onceflow.log.partition_log import PartitionLog


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_700_000_000_000)


@pytest.fixture
def open_log(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., PartitionLog]]:
    """Open logs under tmp_path; whatever a test leaves open is dropped at teardown."""
    opened: list[PartitionLog] = []

    def _open(config: LogConfig | None = None, name: str = "topic-0") -> PartitionLog:
        log = PartitionLog.open(tmp_path / name, config or LogConfig(), clock)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log._abandon()
