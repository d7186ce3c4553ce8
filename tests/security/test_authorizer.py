"""The authorizer's decision rules (Kafka's StandardAuthorizer), filters and the ACL file:
examples, and properties over random ACL sets (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onceflow.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    PatternType,
    PermissionType,
    ResourcePattern,
    ResourceType,
)
from onceflow.security.acl_store import load_acls, store_acls
from onceflow.security.authorizer import Authorizer, parse_super_users
from onceflow.security.principal import user

ALICE = user("alice")
OPS = [op for op in AclOperation if op.name not in ("UNKNOWN", "ANY", "ALL")]
OPS = [op for op in OPS if op not in (AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS)]
TOPIC = ResourceType.TOPIC


def acl(
    name: str,
    op: AclOperation,
    permission: PermissionType = PermissionType.ALLOW,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = PatternType.LITERAL,
    resource_type: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(
        ResourcePattern(resource_type, name, pattern),
        AccessControlEntry(principal, host, op, permission),
    )


def may(authorizer: Authorizer, op: AclOperation, name: str, host: str = "10.0.0.1") -> bool:
    return authorizer.authorize(ALICE, host, op, TOPIC, name)


def test_no_acl_denies_unless_allow_everyone_if_no_acl_found() -> None:
    assert not may(Authorizer(), AclOperation.READ, "t")
    assert may(Authorizer(allow_everyone_if_no_acl_found=True), AclOperation.READ, "t")
    # An ACL on the resource for someone else: the no-ACL rule no longer applies.
    other = Authorizer([acl("t", AclOperation.READ, principal="User:bob")], frozenset(), True)
    assert not may(other, AclOperation.READ, "t")
    assert may(other, AclOperation.READ, "u")


def test_implied_operations_only_from_allow() -> None:
    for op in (AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER):
        assert may(Authorizer([acl("t", op)]), AclOperation.DESCRIBE, "t")
    assert not may(Authorizer([acl("t", AclOperation.CREATE)]), AclOperation.DESCRIBE, "t")
    configs = Authorizer([acl("t", AclOperation.ALTER_CONFIGS)])
    assert may(configs, AclOperation.DESCRIBE_CONFIGS, "t")
    # A DENY of READ does not deny DESCRIBE.
    deny_read = Authorizer(
        [acl("t", AclOperation.READ, PermissionType.DENY), acl("t", AclOperation.DESCRIBE)]
    )
    assert may(deny_read, AclOperation.DESCRIBE, "t")
    assert not may(deny_read, AclOperation.READ, "t")


def test_deny_wins_prefixed_wildcards_and_hosts() -> None:
    authorizer = Authorizer(
        [
            acl("orders-", AclOperation.ALL, pattern=PatternType.PREFIXED),
            acl("orders-secret", AclOperation.READ, PermissionType.DENY, principal="User:*"),
            acl("*", AclOperation.DESCRIBE),
            acl("pinned", AclOperation.WRITE, host="10.0.0.2"),
        ]
    )
    assert may(authorizer, AclOperation.WRITE, "orders-eu")
    assert may(authorizer, AclOperation.READ, "orders-")
    assert not may(authorizer, AclOperation.READ, "orders")  # a prefix is not the name
    assert not may(authorizer, AclOperation.READ, "orders-secret")
    assert may(authorizer, AclOperation.WRITE, "orders-secret")
    assert may(authorizer, AclOperation.DESCRIBE, "anything")
    assert not may(authorizer, AclOperation.WRITE, "pinned")
    assert may(authorizer, AclOperation.WRITE, "pinned", host="10.0.0.2")


def test_super_users() -> None:
    supers = parse_super_users(" User:admin ; User:alice;")
    assert supers == {"User:admin", "User:alice"}
    deny_all = acl("t", AclOperation.ALL, PermissionType.DENY, principal="User:*")
    assert may(Authorizer([deny_all], supers), AclOperation.WRITE, "t")


def test_authorize_by_resource_type() -> None:
    def any_write(*acls: AclBinding) -> bool:
        return Authorizer(acls).authorize_by_resource_type(ALICE, "h", AclOperation.WRITE, TOPIC)

    assert not any_write()
    assert any_write(acl("t", AclOperation.WRITE))
    assert any_write(acl("t", AclOperation.ALL))
    assert not any_write(acl("t", AclOperation.READ))
    assert not any_write(
        acl("t", AclOperation.WRITE), acl("t", AclOperation.WRITE, PermissionType.DENY)
    )
    assert not any_write(
        acl("t", AclOperation.WRITE),
        acl("*", AclOperation.WRITE, PermissionType.DENY),
    )
    assert not any_write(
        acl("ab", AclOperation.WRITE, pattern=PatternType.PREFIXED),
        acl("a", AclOperation.WRITE, PermissionType.DENY, pattern=PatternType.PREFIXED),
    )
    assert any_write(acl("*", AclOperation.WRITE))


def test_filters_select_as_kafka_does() -> None:
    literal = acl("orders", AclOperation.READ)
    prefixed = acl("ord", AclOperation.READ, pattern=PatternType.PREFIXED)
    wildcard = acl("*", AclOperation.READ)
    group = acl("g", AclOperation.READ, resource_type=ResourceType.GROUP)
    every = [literal, prefixed, wildcard, group]
    authorizer = Authorizer(every)

    def names(f: AclBindingFilter) -> set[str]:
        return {b.pattern.name for b in authorizer.acls(f)}

    assert names(AclBindingFilter()) == {"orders", "ord", "*", "g"}
    assert names(AclBindingFilter(TOPIC, "orders", PatternType.MATCH)) == {"orders", "ord", "*"}
    assert names(AclBindingFilter(TOPIC, "orders", PatternType.ANY)) == {"orders"}
    assert names(AclBindingFilter(TOPIC, None, PatternType.PREFIXED)) == {"ord"}
    assert names(AclBindingFilter(TOPIC, "ord", PatternType.LITERAL)) == set()
    assert names(AclBindingFilter(operation=AclOperation.WRITE)) == set()
    assert names(AclBindingFilter(principal="User:alice", resource_type=ResourceType.GROUP)) == {
        "g"
    }


@pytest.mark.parametrize(
    "binding",
    [
        acl("", AclOperation.READ),
        acl("t", AclOperation.ANY),
        acl("t", AclOperation.READ, PermissionType.ANY),
        acl("t", AclOperation.READ, pattern=PatternType.MATCH),
        acl("t", AclOperation.READ, principal="alice"),
        acl("other", AclOperation.ALTER, resource_type=ResourceType.CLUSTER),
        acl("t", AclOperation.READ, resource_type=ResourceType.ANY),
    ],
)
def test_invalid_acls_are_refused(binding: AclBinding) -> None:
    with pytest.raises(AclError):
        binding.validate()


def test_acl_file_round_trip(tmp_path: Path) -> None:
    acls = {acl("t", AclOperation.READ), acl("p-", AclOperation.ALL, pattern=PatternType.PREFIXED)}
    assert load_acls(tmp_path) == frozenset()
    store_acls(tmp_path, acls)
    assert load_acls(tmp_path) == acls
    assert not list(tmp_path.glob("*.tmp"))


# -- properties ------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "ab", "abc", "b", "*"])
bindings = st.builds(
    acl,
    name=NAMES,
    op=st.sampled_from([*OPS, AclOperation.ALL]),
    permission=st.sampled_from([PermissionType.ALLOW, PermissionType.DENY]),
    principal=st.sampled_from(["User:alice", "User:bob", "User:*"]),
    host=st.sampled_from(["*", "10.0.0.1", "10.0.0.2"]),
    pattern=st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
)
questions = st.tuples(st.sampled_from(OPS), st.sampled_from(["a", "ab", "abc", "b", "c"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings, max_size=8), questions, st.booleans())
def test_a_matching_deny_always_wins(acls: list[AclBinding], question, allow_if_none: bool) -> None:
    op, name = question
    deny = acl(name, op, PermissionType.DENY, principal="User:*")
    authorizer = Authorizer([*acls, deny], frozenset(), allow_if_none)
    assert not may(authorizer, op, name)


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings, max_size=8), questions)
def test_adding_an_allow_never_takes_a_permission_away(acls: list[AclBinding], question) -> None:
    op, name = question
    before = may(Authorizer(acls), op, name)
    extra = acl(name, op)
    after = Authorizer([*acls, extra])
    assert may(after, op, name) or any(b.entry.permission_type == PermissionType.DENY for b in acls)
    assert not before or may(after, op, name)


@settings(max_examples=300, deadline=None)
@given(st.lists(bindings, max_size=8), questions)
def test_decision_is_the_rule_written_plainly(acls: list[AclBinding], question) -> None:
    """An independent statement of the rule: some applicable ALLOW and no applicable DENY."""
    op, name = question
    host = "10.0.0.1"

    def applies(b: AclBinding) -> bool:
        p, e = b.pattern, b.entry
        name_ok = (
            name.startswith(p.name)
            if p.pattern_type == PatternType.PREFIXED
            else (p.name in (name, "*"))
        )
        return name_ok and e.principal in ("User:alice", "User:*") and e.host in ("*", host)

    deny = any(
        applies(b) and b.entry.permission_type == PermissionType.DENY
        and b.entry.operation in (op, AclOperation.ALL)
        for b in acls
    )  # fmt: skip
    implied = {
        AclOperation.DESCRIBE: {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                                AclOperation.ALTER},
        AclOperation.DESCRIBE_CONFIGS: {AclOperation.ALTER_CONFIGS},
    }.get(op, set())  # fmt: skip
    allow = any(
        applies(b) and b.entry.permission_type == PermissionType.ALLOW
        and (b.entry.operation in (op, AclOperation.ALL) or b.entry.operation in implied)
        for b in acls
    )  # fmt: skip
    assert may(Authorizer(acls), op, name, host) == (allow and not deny)
    # And the cached answer is the same as the first one.
    authorizer = Authorizer(acls)
    assert may(authorizer, op, name, host) == may(authorizer, op, name, host)


@settings(max_examples=200, deadline=None)
@given(st.lists(bindings, max_size=8), st.sampled_from(OPS))
def test_by_resource_type_agrees_with_some_name(acls: list[AclBinding], op: AclOperation) -> None:
    """If the principal may do `op` on some concrete name through an explicit, non-implied
    ALLOW, authorize_by_resource_type says yes; if it says yes, some name is allowed."""
    authorizer = Authorizer(acls)
    by_type = authorizer.authorize_by_resource_type(ALICE, "10.0.0.1", op, TOPIC)
    # Every name an ACL names, and one past each prefix.
    candidates = [n for b in acls for n in (b.pattern.name, b.pattern.name + "x")]
    exact = Authorizer(
        [b for b in acls if b.entry.operation in (op, AclOperation.ALL)
         or b.entry.permission_type == PermissionType.DENY]
    )  # fmt: skip
    if by_type:
        # As Kafka's authorizeByResourceType, a yes is either authorize() on a name no ACL
        # names (where an implied ALLOW through `*`, AlterConfigs for DescribeConfigs, counts)
        # or an explicit ALLOW on some name.
        unnamed = may(authorizer, op, "\x00hardcode")
        assert unnamed or any(may(exact, op, n) for n in candidates)
