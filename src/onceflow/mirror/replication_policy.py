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


def cycle_pattern(target_alias: str) -> str:
    """Topics whose default-policy names say they came from `target_alias`: `{alias}.X`,
    `other.{alias}.X`... MirrorMaker 2's MirrorSourceConnector.isCycle (topicSource, then the
    upstream topic's, down the chain), which keeps such topics from going back where they came
    from."""
    return rf"(?:.*\.)?{re.escape(target_alias)}\..+"


def subscription_pattern(topics: str, target_alias: str | None = None) -> str:
    """The source's subscribePattern: `topics` (matched whole, as Java's Pattern.matches) minus
    MirrorMaker 2's excluded topics, and minus those that came from `target_alias`, if given."""
    try:
        re.compile(topics)
    except re.error as exc:
        raise ReplicationPolicyError(f"--topics {topics!r} is not a regex: {exc}") from exc
    excluded = EXCLUDED_TOPICS
    if target_alias is not None:
        excluded = f"{excluded}|{cycle_pattern(target_alias)}"
    return f"(?!(?:{excluded})$)(?:{topics})"
