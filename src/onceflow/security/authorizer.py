"""The decision rules of Kafka's StandardAuthorizer, sans-IO: given the ACLs, may this
principal from this host do this operation on this resource?

- A super user (`super.users`) may do everything.
- The ACLs that apply are those whose pattern covers the resource (its literal name, the
  wildcard `*`, or a prefix), whose principal is the caller's or `User:*`, whose host is the
  caller's address or `*`, and whose operation is the one asked for or ALL.
- An ALLOW of READ, WRITE, DELETE or ALTER also allows DESCRIBE, and an ALLOW of ALTER_CONFIGS
  allows DESCRIBE_CONFIGS; a DENY denies only what it names (or ALL).
- A matching DENY wins over any ALLOW; no matching ALLOW denies, unless no ACL at all exists
  for the resource and `allow.everyone.if.no.acl.found` is true.
"""

from __future__ import annotations

from collections.abc import Iterable

from onceflow.security.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourceType,
)
from onceflow.security.acl_index import AclIndex, matching_prefixes
from onceflow.security.principal import KafkaPrincipal

# The authorizer class names that turn authorization on (KRaft's, and ZooKeeper mode's).
AUTHORIZER_CLASS_NAMES = (
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
)

_IMPLIES_DESCRIBE = frozenset(
    {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
_CACHE_LIMIT = 10_000
# Group and transactional ids have no length limit: a name longer than this is decided afresh
# (a few look-ups) rather than kept, so the cache holds at most 10,000 short keys.
_CACHED_NAME_LIMIT = 1024
# May (principal, host) do (operation) on (resource type, name)? The principal as its text.
Question = tuple[str, str, AclOperation, ResourceType, str]
_ANY_USER = str(WILDCARD_PRINCIPAL)


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: principals separated by semicolons, `User:admin;User:ops`."""
    return frozenset(p.strip() for p in text.split(";") if p.strip())


def operation_allowed_by(entry_operation: AclOperation, operation: AclOperation) -> bool:
    """Does an ALLOW entry of `entry_operation` allow `operation`?"""
    if entry_operation in (AclOperation.ALL, operation):
        return True
    if operation == AclOperation.DESCRIBE:
        return entry_operation in _IMPLIES_DESCRIBE
    if operation == AclOperation.DESCRIBE_CONFIGS:
        return entry_operation in _IMPLIES_DESCRIBE_CONFIGS
    return False


class Authorizer:
    def __init__(
        self,
        acls: Iterable[AclBinding] | AclIndex = (),
        super_users: frozenset[str] = frozenset(),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.super_users = super_users
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._index = AclIndex()
        # Decisions, by (principal, host, operation, type, name): a Produce asks the same
        # question for every request; any change of the ACLs empties it.
        self._cache: dict[Question, bool] = {}
        self._by_type_cache: dict[Question, bool] = {}
        self.install(acls)

    # -- the ACLs ----------------------------------------------------------------------------

    def install(self, acls: Iterable[AclBinding] | AclIndex) -> None:
        """Serve these ACLs from now on (once they are stored). An AclIndex built beforehand
        (off the event loop: 10,000 ACLs take about 0.1 s to index) is swapped in as it is."""
        self._index = acls if isinstance(acls, AclIndex) else AclIndex(acls)
        self._cache = {}
        self._by_type_cache = {}

    @property
    def index(self) -> AclIndex:
        """The ACLs served now, indexed (immutable: a change installs a new one)."""
        return self._index

    def bindings(self) -> frozenset[AclBinding]:
        return self._index.bindings

    def acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return self._index.select(acl_filter)

    # -- decisions ---------------------------------------------------------------------------

    def is_super_user(self, principal: KafkaPrincipal) -> bool:
        return str(principal) in self.super_users

    def authorize(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        if self.is_super_user(principal):
            return True
        key = (str(principal), host, operation, resource_type, name)
        if len(name) > _CACHED_NAME_LIMIT:
            return self._decide(key)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(key)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def _decide(self, question: Question) -> bool:
        """StandardAuthorizerData.findAclRule over the patterns that cover the resource only:
        a matching DENY wins, then a matching ALLOW, then the no-ACL rule."""
        caller, host, operation, resource_type, name = question
        has_resource_acls = False
        allowed = False
        principals = (caller,) if caller == _ANY_USER else (caller, _ANY_USER)
        for by_principal in self._index.applicable(resource_type, name):
            has_resource_acls = True
            for principal in principals:
                for entry in by_principal.get(principal, ()):
                    if entry.host != WILDCARD and entry.host != host:
                        continue
                    if entry.permission_type == PermissionType.DENY:
                        if entry.operation in (AclOperation.ALL, operation):
                            return False
                    elif not allowed and operation_allowed_by(entry.operation, operation):
                        allowed = True
        if allowed:
            return True
        return not has_resource_acls and self.allow_everyone_if_no_acl_found

    def authorize_by_resource_type(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """May the principal do `operation` on at least one resource of this type? (Kafka's
        Authorizer.authorizeByResourceType: an ALLOW on some literal name or prefix that no
        DENY of the same operation covers; implied operations do not count here.)"""
        # A name no ACL can name: super users, wildcard ALLOWs, and the no-ACL rule.
        if self.authorize(principal, host, operation, resource_type, "\x00hardcode"):
            return True
        caller = str(principal)
        key = (caller, host, operation, resource_type, "")
        decision = self._by_type_cache.get(key)
        if decision is None:
            decision = self._decide_by_resource_type(key)
            if len(self._by_type_cache) >= _CACHE_LIMIT:
                self._by_type_cache.clear()
            self._by_type_cache[key] = decision
        return decision

    def _decide_by_resource_type(self, question: Question) -> bool:
        caller, host, operation, resource_type, _ = question
        denied: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        allowed: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        # Only the caller's ACLs and User:*'s can count (Kafka's AclCache.aclsByPrincipal).
        principals = (caller,) if caller == _ANY_USER else (caller, _ANY_USER)
        for principal in principals:
            for binding in self._index.of_principal(resource_type, principal):
                entry = binding.entry
                if entry.host not in (WILDCARD, host):
                    continue
                if entry.operation not in (AclOperation.ALL, operation):
                    continue
                side = denied if entry.permission_type == PermissionType.DENY else allowed
                side[binding.pattern.pattern_type].add(binding.pattern.name)
        if WILDCARD in denied[PatternType.LITERAL]:
            return False
        denied_prefixes = sorted(denied[PatternType.PREFIXED])

        def denied_by_prefix(name: str) -> bool:
            return next(matching_prefixes(denied_prefixes, name), None) is not None

        for name in allowed[PatternType.LITERAL]:
            if name not in denied[PatternType.LITERAL] and not denied_by_prefix(name):
                return True
        return any(not denied_by_prefix(prefix) for prefix in allowed[PatternType.PREFIXED])
