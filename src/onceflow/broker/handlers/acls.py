"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): the protocol edge of the ACLs
(security/acl_changes.py decides, acl_store.py stores, the authorizer serves them). A change is
answered once it is on disk. DESCRIBE on the Cluster is needed to describe, ALTER to change;
without an authorizer every answer is SECURITY_DISABLED, as Kafka's."""

from __future__ import annotations

import asyncio
import datetime
import enum
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.errors import ErrorCode
from kio.static.primitive import i8

from onceflow.broker.handlers.context import SecurityContext
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth
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
from onceflow.security.acl_changes import Outcome, failed_all, plan_creations, plan_deletions
from onceflow.security.acl_store import AclStoreError, store_acls

if TYPE_CHECKING:
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
_NO_THROTTLE = datetime.timedelta(0)
_DISABLED = "No Authorizer is configured."
E = TypeVar("E", bound=enum.IntEnum)


def handle_describe_acls(ctx: SecurityContext, request: Request) -> Any:
    cls = response_type(DESCRIBE_ACLS, request.api_version)
    authorizer = ctx.security.authorizer
    error, message, resources = ErrorCode.none, None, ()
    if authorizer is None:
        error, message = ErrorCode.security_disabled, _DISABLED
    elif not auth.authorize_cluster(request.session, auth.DESCRIBE):
        error, message = ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
    else:
        acl_filter = _filter(request.body)
        try:
            acl_filter.validate()
        except AclError as e:
            error, message = ErrorCode.invalid_request, str(e)
        else:
            resources = _by_resource(cls, authorizer.acls(acl_filter))
    return build(
        cls,
        throttle_time=_NO_THROTTLE,
        error_code=error,
        error_message=message,
        resources=resources,
    )


def _by_resource(cls: type, bindings: Iterable[AclBinding]) -> tuple[Any, ...]:
    resource_cls, acl_cls = sibling(cls, "DescribeAclsResource"), sibling(cls, "AclDescription")
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
    authorizer = security.authorizer
    if authorizer is None:
        results = failed_all(len(creations), ErrorCode.security_disabled, _DISABLED)
    elif not auth.authorize_cluster(request.session, auth.ALTER):
        results = failed_all(len(creations), ErrorCode.cluster_authorization_failed)
    else:
        async with security.acls_lock:  # each change planned against the last one stored
            plan = plan_creations(authorizer.bindings(), [_binding(c) for c in creations])
            results = plan.results
            if plan.created:
                error = await _store(ctx, request, plan.acls, "created", plan.created)
                if error is not None:
                    results = failed_all(len(creations), ErrorCode.kafka_storage_error, error)
    cls = response_type(CREATE_ACLS, request.api_version)
    result_cls = sibling(cls, "AclCreationResult")
    return build(
        cls,
        throttle_time=_NO_THROTTLE,
        results=tuple(
            build(result_cls, error_code=r.error_code, error_message=r.error_message)
            for r in results
        ),
    )


def handle_delete_acls(ctx: SecurityContext, request: Request) -> Any:
    return _delete(ctx, request)


async def _delete(ctx: SecurityContext, request: Request) -> Any:
    filters = request.body.filters
    security = ctx.security
    authorizer = security.authorizer
    results: list[tuple[Outcome, list[AclBinding]]]
    if authorizer is None:
        results = [
            (r, []) for r in failed_all(len(filters), ErrorCode.security_disabled, _DISABLED)
        ]
    elif not auth.authorize_cluster(request.session, auth.ALTER):
        results = [
            (r, []) for r in failed_all(len(filters), ErrorCode.cluster_authorization_failed)
        ]
    else:
        async with security.acls_lock:
            plan = plan_deletions(authorizer.bindings(), [_filter(f) for f in filters])
            results = plan.results
            if plan.deleted:
                error = await _store(ctx, request, plan.acls, "deleted", plan.deleted)
                if error is not None:
                    failure = Outcome(ErrorCode.kafka_storage_error, error)
                    results = [(failure, []) for _ in filters]
    cls = response_type(DELETE_ACLS, request.api_version)
    result_cls, matching_cls = (
        sibling(cls, "DeleteAclsFilterResult"),
        sibling(cls, "DeleteAclsMatchingAcl"),
    )
    return build(
        cls,
        throttle_time=_NO_THROTTLE,
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
        await asyncio.to_thread(store_acls, security.data_dir, acls)
    except AclStoreError as e:
        log.error("%s", e)
        return str(e)
    security.authorizer.install(acls)
    log.info(
        "ACLs %s by %s: %s",
        verb,
        request.session.principal if request.session else "?",
        "; ".join(f"{b.pattern} {b.entry}" for b in changed),
    )
    return None


def _enum(cls: type[E], value: int, unknown: E) -> E:
    try:
        return cls(value)
    except ValueError:
        return unknown  # validated later: answered INVALID_REQUEST


def _binding(creation: Any) -> AclBinding:
    return AclBinding(
        ResourcePattern(
            _enum(ResourceType, creation.resource_type, ResourceType.UNKNOWN),
            creation.resource_name,
            _enum(PatternType, creation.resource_pattern_type, PatternType.UNKNOWN),
        ),
        AccessControlEntry(
            creation.principal,
            creation.host,
            _enum(AclOperation, creation.operation, AclOperation.UNKNOWN),
            _enum(PermissionType, creation.permission_type, PermissionType.UNKNOWN),
        ),
    )


def _filter(body: Any) -> AclBindingFilter:
    return AclBindingFilter(
        _enum(ResourceType, body.resource_type_filter, ResourceType.UNKNOWN),
        body.resource_name_filter,
        _enum(PatternType, body.pattern_type_filter, PatternType.UNKNOWN),
        body.principal_filter,
        body.host_filter,
        _enum(AclOperation, body.operation, AclOperation.UNKNOWN),
        _enum(PermissionType, body.permission_type, PermissionType.UNKNOWN),
    )
