"""Kafka's ACL model: resource patterns, ACL entries, bindings, and the filters that
DescribeAcls and DeleteAcls select bindings with (org.apache.kafka.common.acl and .resource).

The enum values are the wire codes of the CreateAcls/DescribeAcls/DeleteAcls schemas.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Self

from onceflow.security.principal import KafkaPrincipal

WILDCARD = "*"  # a LITERAL resource name, or a host, matching every one
CLUSTER_NAME = "kafka-cluster"  # the one Cluster resource's name
WILDCARD_PRINCIPAL = KafkaPrincipal("User", "*")


class AclError(ValueError):
    """An ACL or filter that is not valid (Kafka answers INVALID_REQUEST)."""


class _Named(enum.IntEnum):
    """Kafka's enums print and parse as UPPER_SNAKE names; kafka-acls takes CamelCase too."""

    @classmethod
    def parse(cls, text: str) -> _Named:
        key = text.strip().replace("-", "_").upper()
        compact = {member.name.replace("_", ""): member for member in cls}
        member = cls.__members__.get(key) or compact.get(key.replace("_", ""))
        if member is None or member.name in ("UNKNOWN", "ANY", "MATCH"):
            raise AclError(f"unknown {cls.__name__} {text!r}")
        return member

    @classmethod
    def of_code(cls, code: int) -> Self:
        """The member of a wire code; UNKNOWN (every enum's 0) for a code it does not know,
        which validation then refuses (INVALID_REQUEST, as Kafka's)."""
        try:
            return cls(code)
        except ValueError:
            return cls(0)

    def camel(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_"))


class ResourceType(_Named):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_Named):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_Named):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class PermissionType(_Named):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


# The resource types onceflow has (no delegation tokens; users are managed through the
# SCRAM APIs, authorized on the Cluster).
SUPPORTED_RESOURCE_TYPES = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.CLUSTER,
    ResourceType.TRANSACTIONAL_ID,
)

# The operations an ACL on each resource type can name, besides ALL (Kafka's
# AclEntry.supportedOperations: kafka-acls refuses the others).
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset({AclOperation.DESCRIBE, AclOperation.WRITE}),
}


@dataclass(frozen=True, order=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def matches(self, resource_type: ResourceType, name: str) -> bool:
        """Does this pattern cover the resource (type, name)?"""
        if resource_type != self.resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == name or self.name == WILDCARD

    def __str__(self) -> str:
        return f"{self.resource_type.camel()}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, order=True)
class AccessControlEntry:
    principal: str  # "User:alice", "User:*"
    host: str
    operation: AclOperation
    permission_type: PermissionType

    def __str__(self) -> str:
        return (
            f"(principal={self.principal}, host={self.host}, "
            f"operation={self.operation.name}, permissionType={self.permission_type.name})"
        )


@dataclass(frozen=True, order=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    @classmethod
    def from_codes(
        cls,
        resource_type: int,
        name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission_type: int,
    ) -> AclBinding:
        """A binding from its seven fields as the wire (and Kafka's clients) carry them."""
        return cls(
            ResourcePattern(
                ResourceType.of_code(resource_type), name, PatternType.of_code(pattern_type)
            ),
            AccessControlEntry(
                principal,
                host,
                AclOperation.of_code(operation),
                PermissionType.of_code(permission_type),
            ),
        )

    def validate(self) -> None:
        """Kafka's checks of a new ACL (AclControlManager.validateNewAcl, and the Cluster
        resource's one name)."""
        pattern, entry = self.pattern, self.entry
        if pattern.resource_type not in SUPPORTED_RESOURCE_TYPES:
            raise AclError(f"Invalid resourceType {pattern.resource_type.name}")
        if pattern.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"Invalid patternType {pattern.pattern_type.name}")
        if entry.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise AclError(f"Invalid operation {entry.operation.name}")
        if entry.permission_type not in (PermissionType.ALLOW, PermissionType.DENY):
            raise AclError(f"Invalid permissionType {entry.permission_type.name}")
        if not pattern.name:
            raise AclError("Illegal empty resource name")
        if pattern.resource_type == ResourceType.CLUSTER and pattern.name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        parse_principal(entry.principal)
        if not entry.host:
            raise AclError("Illegal empty host")


def parse_principal(text: str) -> KafkaPrincipal:
    principal_type, sep, name = text.partition(":")
    if not sep or not principal_type or not name:
        raise AclError(f"Could not parse principal from `{text}` (no colon is present).")
    return KafkaPrincipal(principal_type, name)


@dataclass(frozen=True)
class AclBindingFilter:
    """None in a field matches anything; ANY in an enum field too. MATCH as the pattern type
    selects the patterns that apply to the named resource (literal, wildcard, prefixes)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: PermissionType = PermissionType.ANY

    @classmethod
    def from_codes(
        cls,
        resource_type: int,
        name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission_type: int,
    ) -> AclBindingFilter:
        """A filter from its seven fields as the wire carries them."""
        return cls(
            ResourceType.of_code(resource_type),
            name,
            PatternType.of_code(pattern_type),
            principal,
            host,
            AclOperation.of_code(operation),
            PermissionType.of_code(permission_type),
        )

    def validate(self) -> None:
        fields = (self.resource_type, self.pattern_type, self.operation, self.permission_type)
        if any(value.name == "UNKNOWN" for value in fields):
            raise AclError("Filter contains UNKNOWN elements")

    def matches(self, binding: AclBinding) -> bool:
        return self._matches_pattern(binding.pattern) and self._matches_entry(binding.entry)

    def _matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type not in (ResourceType.ANY, pattern.resource_type):
            return False
        if self.pattern_type in (PatternType.ANY, PatternType.MATCH) and self.name is None:
            return True
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH):
            return self.pattern_type == pattern.pattern_type and self.name in (None, pattern.name)
        if self.pattern_type == PatternType.ANY:
            return self.name == pattern.name
        # MATCH: every pattern that would apply to a resource of this name.
        assert self.name is not None
        if pattern.pattern_type == PatternType.LITERAL:
            return pattern.name in (self.name, WILDCARD)
        return self.name.startswith(pattern.name)

    def _matches_entry(self, entry: AccessControlEntry) -> bool:
        return (
            self.principal in (None, entry.principal)
            and self.host in (None, entry.host)
            and self.operation in (AclOperation.ANY, entry.operation)
            and self.permission_type in (PermissionType.ANY, entry.permission_type)
        )
