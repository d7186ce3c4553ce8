"""MirrorMaker 2's replication policies: the name a source topic gets in the target cluster."""

from __future__ import annotations

import re
from dataclasses import dataclass

POLICIES = ("default", "identity")

# MirrorMaker 2's default topics.exclude: internal and replica topics are never mirrored.
EXCLUDED_TOPICS = r"__.*|.*[-.]internal|.*\.replica"


class ReplicationPolicyError(ValueError):
    """An unknown policy, an empty alias, or a --topics that is not a regex."""


@dataclass(frozen=True)
class ReplicationPolicy:
    """`default`: `{alias}.{topic}` (DefaultReplicationPolicy); `identity`: the same name
    (IdentityReplicationPolicy)."""

    name: str = "default"
    alias: str = "source"

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ReplicationPolicyError(
                f"--replication-policy must be one of {', '.join(POLICIES)}, not {self.name!r}"
            )
        if not self.alias or "." in self.alias:
            # the default policy's separator: an alias holding it could not be told apart
            raise ReplicationPolicyError(f"--source-alias {self.alias!r}: empty or holds a '.'")

    def target_topic(self, source_topic: str) -> str:
        return source_topic if self.name == "identity" else f"{self.alias}.{source_topic}"


def subscription_pattern(topics: str) -> str:
    """The source's subscribePattern: `topics` (matched whole, as Java's Pattern.matches) minus
    MirrorMaker 2's excluded topics."""
    try:
        re.compile(topics)
    except re.error as exc:
        raise ReplicationPolicyError(f"--topics {topics!r} is not a regex: {exc}") from exc
    return f"(?!(?:{EXCLUDED_TOPICS})$)(?:{topics})"
