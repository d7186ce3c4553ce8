"""What the group coordinator's managers share: the clock, the settings, the loading flag."""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.clock import Clock
from onceflow.groups.config import GroupCoordinatorConfig


@dataclass
class GroupContext:
    clock: Clock
    config: GroupCoordinatorConfig
    # True while ``__consumer_offsets`` is replayed at start-up: requests get the answer Kafka
    # gives while loading (mostly COORDINATOR_LOAD_IN_PROGRESS).
    loading: bool = False
