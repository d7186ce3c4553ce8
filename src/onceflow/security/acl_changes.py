"""What CreateAcls and DeleteAcls change, sans-IO: from the current ACL set and a request's
bindings or filters, the new set and each creation's or filter's result (Kafka's
AclControlManager: each creation validated on its own, an ACL that exists already is no
error; each filter deletes what it matches and reports it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.security.acl import AclBinding, AclBindingFilter, AclError
from onceflow.security.acl_index import AclIndex


@dataclass(frozen=True)
class Outcome:
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None


@dataclass
class CreationPlan:
    acls: frozenset[AclBinding]
    results: list[Outcome]
    created: list[AclBinding] = field(default_factory=list)


@dataclass
class DeletionPlan:
    acls: frozenset[AclBinding]
    # Per filter: its outcome and the ACLs it deleted.
    results: list[tuple[Outcome, list[AclBinding]]]

    @property
    def deleted(self) -> list[AclBinding]:
        return [binding for _, bindings in self.results for binding in bindings]


def plan_creations(current: frozenset[AclBinding], creations: Iterable[AclBinding]) -> CreationPlan:
    acls = set(current)
    plan = CreationPlan(frozenset(), [])
    for binding in creations:
        try:
            binding.validate()
        except AclError as e:
            plan.results.append(Outcome(ErrorCode.invalid_request, str(e)))
            continue
        if binding not in acls:
            acls.add(binding)
            plan.created.append(binding)
        plan.results.append(Outcome())
    plan.acls = frozenset(acls)
    return plan


def plan_deletions(
    current: frozenset[AclBinding] | AclIndex, filters: Iterable[AclBindingFilter]
) -> DeletionPlan:
    """Each filter deletes what it matches of what the filters before it left. A filter that
    names a resource or a principal looks only at those ACLs (the index), not at all of them."""
    index = current if isinstance(current, AclIndex) else AclIndex(current)
    deleted: set[AclBinding] = set()
    results: list[tuple[Outcome, list[AclBinding]]] = []
    for acl_filter in filters:
        try:
            acl_filter.validate()
        except AclError as e:
            results.append((Outcome(ErrorCode.invalid_request, str(e)), []))
            continue
        matched = [
            b for b in index.candidates(acl_filter) if b not in deleted and acl_filter.matches(b)
        ]
        deleted.update(matched)
        results.append((Outcome(), matched))
    return DeletionPlan(index.bindings - deleted, results)


def failed_all(count: int, code: ErrorCode, message: str | None = None) -> list[Outcome]:
    return [Outcome(code, message)] * count
