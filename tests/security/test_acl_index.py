"""The indexed authorizer (security/acl_index.py) against the linear one it replaced, kept here
as the reference model: the same decisions, by-type answers, DescribeAcls selections and
DeleteAcls plans across random ACL sets, principals, hosts, operations and names (hypothesis).
Names come from a three-letter alphabet so that literal names, `*` and prefixes collide often."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.security.acl import (
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    PatternType,
    PermissionType,
    ResourcePattern,
    ResourceType,
)
from onceflow.security.acl_changes import plan_deletions
from onceflow.security.acl_index import AclIndex, matching_prefixes
from onceflow.security.authorizer import Authorizer, operation_allowed_by
from onceflow.security.principal import KafkaPrincipal

# -- the reference model: the authorizer as it was, one scan of every ACL per question -------

_ANY_USER = str(WILDCARD_PRINCIPAL)


def _is_about(entry: AccessControlEntry, caller: str, host: str) -> bool:
    return entry.principal in (caller, _ANY_USER) and entry.host in (WILDCARD, host)


class LinearAuthorizer:
    def __init__(
        self, acls: Iterable[AclBinding], super_users: frozenset[str], allow_if_none: bool
    ) -> None:
        self.bindings = frozenset(acls)
        self.super_users = super_users
        self.allow_if_none = allow_if_none

    def authorize(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        caller = str(principal)
        if caller in self.super_users:
            return True
        has_resource_acls = False
        allowed = False
        for binding in sorted(self.bindings):
            if not binding.pattern.matches(resource_type, name):
                continue
            has_resource_acls = True
            entry = binding.entry
            if not _is_about(entry, caller, host):
                continue
            if entry.permission_type == PermissionType.DENY:
                if entry.operation in (AclOperation.ALL, operation):
                    return False
            elif operation_allowed_by(entry.operation, operation):
                allowed = True
        return allowed or (not has_resource_acls and self.allow_if_none)

    def authorize_by_resource_type(
        self,
        principal: KafkaPrincipal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        if self.authorize(principal, host, operation, resource_type, "\x00hardcode"):
            return True
        caller = str(principal)
        denied: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        allowed: dict[PatternType, set[str]] = {
            PatternType.LITERAL: set(),
            PatternType.PREFIXED: set(),
        }
        for binding in sorted(self.bindings):
            if binding.pattern.resource_type != resource_type:
                continue
            entry = binding.entry
            if not _is_about(entry, caller, host):
                continue
            if entry.operation not in (AclOperation.ALL, operation):
                continue
            side = denied if entry.permission_type == PermissionType.DENY else allowed
            side[binding.pattern.pattern_type].add(binding.pattern.name)
        if WILDCARD in denied[PatternType.LITERAL]:
            return False

        def denied_by_prefix(name: str) -> bool:
            return any(name.startswith(prefix) for prefix in denied[PatternType.PREFIXED])

        for name in allowed[PatternType.LITERAL]:
            if name not in denied[PatternType.LITERAL] and not denied_by_prefix(name):
                return True
        return any(not denied_by_prefix(prefix) for prefix in allowed[PatternType.PREFIXED])

    def acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return [b for b in sorted(self.bindings) if acl_filter.matches(b)]

    def plan_deletions(
        self, filters: list[AclBindingFilter]
    ) -> tuple[frozenset[AclBinding], list[list[AclBinding]]]:
        remaining = set(self.bindings)
        deleted = []
        for acl_filter in filters:
            matched = sorted(b for b in remaining if acl_filter.matches(b))
            remaining.difference_update(matched)
            deleted.append(matched)
        return frozenset(remaining), deleted


# -- strategies --------------------------------------------------------------------------------

TYPES = [ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID]
ACL_OPS = [op for op in AclOperation if op.name not in ("UNKNOWN", "ANY")]
HOSTS = ["*", "10.0.0.1", "10.0.0.2"]
CALLERS = ["User:alice", "User:bob", "User:*", "Group:alice"]
names = st.text(alphabet="ab*", max_size=4)
acl_names = st.one_of(names.filter(bool), st.just(WILDCARD))

bindings = st.builds(
    lambda rtype, name, ptype, principal, host, op, perm: AclBinding(
        ResourcePattern(rtype, name, ptype), AccessControlEntry(principal, host, op, perm)
    ),
    st.sampled_from(TYPES),
    acl_names,
    st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
    st.sampled_from(CALLERS[:3]),
    st.sampled_from(HOSTS),
    st.sampled_from(ACL_OPS),
    st.sampled_from([PermissionType.ALLOW, PermissionType.DENY]),
)
principals = st.sampled_from(CALLERS).map(lambda text: KafkaPrincipal(*text.split(":", 1)))
questions = st.tuples(
    principals,
    st.sampled_from(HOSTS[1:]),
    st.sampled_from(ACL_OPS),
    st.sampled_from(TYPES),
    st.one_of(names, st.just("\x00hardcode")),
)
filters = st.builds(
    AclBindingFilter,
    st.sampled_from([ResourceType.ANY, *TYPES]),
    st.one_of(st.none(), names),
    st.sampled_from(
        [PatternType.ANY, PatternType.MATCH, PatternType.LITERAL, PatternType.PREFIXED]
    ),
    st.one_of(st.none(), st.sampled_from(CALLERS)),
    st.one_of(st.none(), st.sampled_from(HOSTS)),
    st.sampled_from([AclOperation.ANY, *ACL_OPS]),
    st.sampled_from([PermissionType.ANY, PermissionType.ALLOW, PermissionType.DENY]),
)
super_users = st.sets(st.sampled_from(CALLERS), max_size=1).map(frozenset)


# -- the properties ----------------------------------------------------------------------------


@settings(max_examples=1000, deadline=None)
@given(
    st.lists(bindings, max_size=24),
    super_users,
    st.booleans(),
    st.lists(questions, min_size=1, max_size=12),
)
def test_decisions_are_the_linear_authorizers(
    acls: list[AclBinding],
    supers: frozenset[str],
    allow_if_none: bool,
    asked: list[tuple[KafkaPrincipal, str, AclOperation, ResourceType, str]],
) -> None:
    reference = LinearAuthorizer(acls, supers, allow_if_none)
    indexed = Authorizer(acls, supers, allow_if_none)
    for _ in range(2):  # the second round is answered from the decision cache
        for question in asked:
            assert indexed.authorize(*question) == reference.authorize(*question), question
            principal, host, operation, resource_type, _name = question
            by_type = (principal, host, operation, resource_type)
            assert indexed.authorize_by_resource_type(
                *by_type
            ) == reference.authorize_by_resource_type(*by_type), by_type


@settings(max_examples=200, deadline=None)
@given(
    st.lists(bindings, max_size=24),
    st.lists(bindings, max_size=24),
    st.lists(questions, min_size=1, max_size=8),
)
def test_an_installed_set_replaces_the_decisions_of_the_last(
    first: list[AclBinding],
    second: list[AclBinding],
    asked: list[tuple[KafkaPrincipal, str, AclOperation, ResourceType, str]],
) -> None:
    authorizer = Authorizer(first)
    for question in asked:
        authorizer.authorize(*question)  # fill the cache with the first set's answers
    authorizer.install(AclIndex(second))
    reference = LinearAuthorizer(second, frozenset(), False)
    assert authorizer.bindings() == frozenset(second)
    for question in asked:
        assert authorizer.authorize(*question) == reference.authorize(*question), question


@settings(max_examples=500, deadline=None)
@given(st.lists(bindings, max_size=24), filters)
def test_describe_selects_what_the_linear_scan_selects(
    acls: list[AclBinding], acl_filter: AclBindingFilter
) -> None:
    reference = LinearAuthorizer(acls, frozenset(), False)
    assert Authorizer(acls).acls(acl_filter) == reference.acls(acl_filter)


@settings(max_examples=500, deadline=None)
@given(st.lists(bindings, max_size=24), st.lists(filters, max_size=6))
def test_delete_plans_what_the_linear_scan_plans(
    acls: list[AclBinding], delete: list[AclBindingFilter]
) -> None:
    remaining, deleted = LinearAuthorizer(acls, frozenset(), False).plan_deletions(delete)
    plan = plan_deletions(AclIndex(acls), delete)
    assert plan.acls == remaining
    assert [matched for _, matched in plan.results] == deleted
    assert plan_deletions(frozenset(acls), delete).results == plan.results


@settings(max_examples=500, deadline=None)
@given(st.sets(st.text(alphabet="abc", max_size=5)), st.text(alphabet="abc", max_size=7))
def test_the_prefix_walk_finds_every_prefix(prefixes: set[str], name: str) -> None:
    found = list(matching_prefixes(sorted(prefixes), name))
    expected = sorted((p for p in prefixes if name.startswith(p)), key=len, reverse=True)
    assert found == expected


def test_the_prefix_walk_jumps_over_prefixes_that_do_not_apply() -> None:
    """A megabyte name against 100,000 prefixes that share its first letter: the walk jumps
    from the nearest one to the shared part at once, and finds the one prefix that applies."""
    prefixes = sorted([f"a{i:06d}" for i in range(100_000)] + ["a"])
    assert list(matching_prefixes(prefixes, "a" + "z" * 1_000_000)) == ["a"]


def test_long_names_are_not_kept_in_the_decision_cache() -> None:
    """Group and transactional ids have no length limit: 300 questions about distinct 100 KiB
    group ids once kept 30 MiB in the cache (10,000 of them, 1 GiB); now nothing is kept."""
    authorizer = Authorizer([], frozenset(), allow_everyone_if_no_acl_found=True)
    alice = KafkaPrincipal("User", "alice")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            name = f"{i:06d}" + "g" * 100 * 1024  # made inside: only the cache can keep it
            assert authorizer.authorize(alice, "h", AclOperation.READ, ResourceType.GROUP, name)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1024 * 1024, f"{kept} bytes kept after 300 distinct 100 KiB names"
    # A short name (cached) is answered as before.
    assert authorizer.authorize(alice, "h", AclOperation.READ, ResourceType.GROUP, "g")
