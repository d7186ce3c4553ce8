"""Consumer lag per group and partition, as kafka-exporter computes it from committed offsets.

Only committed offsets count (a TxnOffsetCommit waits for its transaction's marker), and the
end is the partition's last stable offset: records of a transaction still open are not yet
readable by a read_committed consumer, so they are not lag; with no transaction open it is
the high watermark, kafka-exporter's end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class OffsetsView(Protocol):
    def committed(self, group_id: str) -> dict[tuple[str, int], Any]: ...


@dataclass(frozen=True, slots=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return max(self.end - self.committed, 0)


def consumer_lag(
    group_ids: Iterable[str],
    offsets: OffsetsView,
    partition: Callable[[str, int], Any],
) -> Iterator[PartitionLag]:
    """Each committed (group, partition) whose partition exists, with its lag."""
    for group in group_ids:
        for (topic, index), committed in sorted(offsets.committed(group).items()):
            p = partition(topic, index)
            if p is None:
                continue
            yield PartitionLag(group, topic, index, committed.offset, p.last_stable_offset)
