"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): the protocol edge of the ACLs
(security/acl_changes.py decides, acl_store.py stores, the authorizer serves them). A change is
answered once it is on disk. DESCRIBE on the Cluster is needed to describe, ALTER to change;
without an authorizer every answer is SECURITY_DISABLED, as Kafka's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from onceflow.broker.handlers.context import SecurityContext
from onceflow.broker.handlers.responses import NO_THROTTLE, response_classes, results_response
from onceflow.protocol.entities import build
from onceflow.security import authorization as auth
from onceflow.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    ResourcePattern,
)
from onceflow.security.acl_changes import (
    CreationPlan,
    DeletionPlan,
    Outcome,
    failed_all,
    plan_creations,
    plan_deletions,
)
from onceflow.security.acl_index import AclIndex
from onceflow.security.acl_store import AclStoreError, store_acls

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request
    from onceflow.security.authorizer import Authorizer

log = logging.getLogger(__name__)

_DISABLED = "No Authorizer is configured."


def _authorizer(
    ctx: SecurityContext, request: Request, operation: AclOperation
) -> Authorizer | Outcome:
    """The authorizer, or the Outcome refusing the request as a whole, as Kafka's:
    SECURITY_DISABLED without an authorizer, else CLUSTER_AUTHORIZATION_FAILED without
    `operation` on the Cluster."""
    if ctx.security.authorizer is None:
        return Outcome(ErrorCode.security_disabled, _DISABLED)
    if not auth.authorize_cluster(request.session, operation):
        return Outcome(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    return ctx.security.authorizer


def handle_describe_acls(ctx: SecurityContext, request: Request) -> Any:
    return _describe(ctx, request)


async def _describe(ctx: SecurityContext, request: Request) -> Any:
    cls, resource_cls, acl_cls = response_classes(request, "DescribeAclsResource", "AclDescription")
    authorizer = _authorizer(ctx, request, auth.DESCRIBE)
    outcome, resources = Outcome(), ()
    if isinstance(authorizer, Outcome):
        outcome = authorizer
    else:
        acl_filter = _filter(request.body)
        try:
            acl_filter.validate()
        except AclError as e:
            outcome = Outcome(ErrorCode.invalid_request, str(e))
        else:
            # A filter naming no resource nor principal reads every ACL: off the event loop.
            resources = await asyncio.to_thread(
                _described, authorizer.index, acl_filter, resource_cls, acl_cls
            )
    return build(
        cls,
        throttle_time=NO_THROTTLE,
        error_code=outcome.error_code,
        error_message=outcome.error_message,
        resources=resources,
    )


def _described(
    index: AclIndex, acl_filter: AclBindingFilter, resource_cls: type, acl_cls: type
) -> tuple[Any, ...]:
    return _by_resource(resource_cls, acl_cls, index.select(acl_filter))


def _by_resource(
    resource_cls: type, acl_cls: type, bindings: Iterable[AclBinding]
) -> tuple[Any, ...]:
    grouped: dict[ResourcePattern, list[AccessControlEntry]] = {}
    for binding in bindings:
        grouped.setdefault(binding.pattern, []).append(binding.entry)
    return tuple(
        build(
            resource_cls,
            resource_type=i8(pattern.resource_type),
            resource_name=pattern.name,
            pattern_type=i8(pattern.pattern_type),
            acls=tuple(
                build(
                    acl_cls,
                    principal=e.principal,
                    host=e.host,
                    operation=i8(e.operation),
                    permission_type=i8(e.permission_type),
                )
                for e in entries
            ),
        )
        for pattern, entries in grouped.items()
    )


def handle_create_acls(ctx: SecurityContext, request: Request) -> Any:
    return _create(ctx, request)


async def _create(ctx: SecurityContext, request: Request) -> Any:
    creations = request.body.creations
    security = ctx.security
    authorizer = _authorizer(ctx, request, auth.ALTER)
    if isinstance(authorizer, Outcome):
        results = [authorizer] * len(creations)
    else:
        async with security.acls_lock:  # each change planned against the last one stored
            # Off the event loop: the request may hold many creations, the set many ACLs.
            plan = await asyncio.to_thread(_plan_creations, authorizer.bindings(), creations)
            results = plan.results
            if plan.created:
                error = await _store(ctx, request, plan.acls, "created", plan.created)
                if error is not None:
                    results = failed_all(len(creations), ErrorCode.kafka_storage_error, error)
    return results_response(request, "AclCreationResult", results)


def _plan_creations(current: frozenset[AclBinding], creations: Iterable[Any]) -> CreationPlan:
    return plan_creations(current, [_binding(c) for c in creations])


def handle_delete_acls(ctx: SecurityContext, request: Request) -> Any:
    return _delete(ctx, request)


async def _delete(ctx: SecurityContext, request: Request) -> Any:
    filters = request.body.filters
    security = ctx.security
    results: list[tuple[Outcome, list[AclBinding]]]
    authorizer = _authorizer(ctx, request, auth.ALTER)
    if isinstance(authorizer, Outcome):
        results = [(authorizer, []) for _ in filters]
    else:
        async with security.acls_lock:
            # Off the event loop: each filter that names no resource nor principal reads
            # every ACL, and a request may hold many filters.
            plan = await asyncio.to_thread(_plan_deletions, authorizer.index, filters)
            results = plan.results
            if plan.deleted:
                error = await _store(ctx, request, plan.acls, "deleted", plan.deleted)
                if error is not None:
                    failure = Outcome(ErrorCode.kafka_storage_error, error)
                    results = [(failure, []) for _ in filters]
    return await asyncio.to_thread(_deletion_response, request, results)


def _plan_deletions(index: AclIndex, filters: Iterable[Any]) -> DeletionPlan:
    return plan_deletions(index, [_filter(f) for f in filters])


def _deletion_response(request: Request, results: list[tuple[Outcome, list[AclBinding]]]) -> Any:
    cls, result_cls, matching_cls = response_classes(
        request, "DeleteAclsFilterResult", "DeleteAclsMatchingAcl"
    )
    return build(
        cls,
        throttle_time=NO_THROTTLE,
        filter_results=tuple(
            build(
                result_cls,
                error_code=outcome.error_code,
                error_message=outcome.error_message,
                matching_acls=tuple(
                    build(
                        matching_cls,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=i8(b.pattern.resource_type),
                        resource_name=b.pattern.name,
                        pattern_type=i8(b.pattern.pattern_type),
                        principal=b.entry.principal,
                        host=b.entry.host,
                        operation=i8(b.entry.operation),
                        permission_type=i8(b.entry.permission_type),
                    )
                    for b in deleted
                ),
            )
            for outcome, deleted in results
        ),
    )


async def _store(
    ctx: SecurityContext,
    request: Request,
    acls: frozenset[AclBinding],
    verb: str,
    changed: list[AclBinding],
) -> str | None:
    """Write the new ACL set, then serve it; the error's text if it could not be written."""
    security = ctx.security
    assert security.authorizer is not None
    try:
        index = await asyncio.to_thread(_store_and_index, security.data_dir, acls)
    except AclStoreError as e:
        log.error("%s", e)
        return str(e)
    security.authorizer.install(index)
    log.info(
        "ACLs %s by %s: %s",
        verb,
        request.session.principal if request.session else "?",
        "; ".join(f"{b.pattern} {b.entry}" for b in changed),
    )
    return None


def _store_and_index(data_dir: Path, acls: frozenset[AclBinding]) -> AclIndex:
    """Blocking: write the ACLs, and index them (10,000 take about 0.1 s) for the swap."""
    store_acls(data_dir, acls)
    return AclIndex(acls)


# The seven fields of a binding (and of a filter) in the order AclBinding.from_codes takes them,
# as CreateAcls' creations and DescribeAcls'/DeleteAcls' filters name them.
_CREATION_FIELDS = (
    "resource_type", "resource_name", "resource_pattern_type", "principal", "host", "operation",
    "permission_type",
)  # fmt: skip
_FILTER_FIELDS = (
    "resource_type_filter", "resource_name_filter", "pattern_type_filter", "principal_filter",
    "host_filter", "operation", "permission_type",
)  # fmt: skip


def _binding(creation: Any) -> AclBinding:
    return AclBinding.from_codes(*(getattr(creation, name) for name in _CREATION_FIELDS))


def _filter(body: Any) -> AclBindingFilter:
    return AclBindingFilter.from_codes(*(getattr(body, name) for name in _FILTER_FIELDS))
