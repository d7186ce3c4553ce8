"""The one place handlers ask whether a request may act on a resource, as KafkaApis asks its
AuthHelper: `authorize(session, operation, resource type, name)`, a batch filter, the by-type
question, and the Kafka error each resource type answers a refusal with.

Without an authorizer (`authorizer.class.name` unset) every question is answered yes, as
before ACLs existed. A request without a session (a handler driven directly in a test) too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from kio.schema.errors import ErrorCode

from onceflow.security.acl import CLUSTER_NAME, SUPPORTED_OPERATIONS, AclOperation, ResourceType

if TYPE_CHECKING:
    from onceflow.security.session import Session

# The names handlers use, as KafkaApis does (AclOperation.READ, ResourceType.TOPIC ...).
READ = AclOperation.READ
WRITE = AclOperation.WRITE
CREATE = AclOperation.CREATE
DELETE = AclOperation.DELETE
ALTER = AclOperation.ALTER
DESCRIBE = AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
ALTER_CONFIGS = AclOperation.ALTER_CONFIGS
IDEMPOTENT_WRITE = AclOperation.IDEMPOTENT_WRITE
TOPIC = ResourceType.TOPIC
GROUP = ResourceType.GROUP
CLUSTER = ResourceType.CLUSTER
TRANSACTIONAL_ID = ResourceType.TRANSACTIONAL_ID

AUTHORIZATION_FAILED = {
    TOPIC: ErrorCode.topic_authorization_failed,
    GROUP: ErrorCode.group_authorization_failed,
    CLUSTER: ErrorCode.cluster_authorization_failed,
    TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
}

# The schemas' default for authorized operations: not asked for (Metadata v8+, DescribeGroups
# v3+ ...), as Kafka answers when the include_*_authorized_operations flag is false.
NOT_REQUESTED = -2147483648

# Kafka's authorizer audit log: refusals of what a request explicitly asked for, at INFO.
audit = logging.getLogger("onceflow.authorizer")

T = TypeVar("T")


def enabled(session: Session | None) -> bool:
    return session is not None and session.authorizer is not None


def authorize(
    session: Session | None,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str = CLUSTER_NAME,
    *,
    log_if_denied: bool = True,
) -> bool:
    """May this connection's principal, from its host, do `operation` on the resource?"""
    if session is None or session.authorizer is None:
        return True
    allowed = session.authorizer.authorize(
        session.principal, session.host, operation, resource_type, name
    )
    if not allowed and log_if_denied:
        audit.info(
            "Principal = %s is Denied operation = %s from host = %s on resource = %s:%s",
            session.principal,
            operation.camel(),
            session.host,
            resource_type.camel(),
            name,
        )
    return allowed


def authorize_cluster(session: Session | None, operation: AclOperation) -> bool:
    return authorize(session, operation, CLUSTER, CLUSTER_NAME)


def filter_authorized(
    session: Session | None,
    operation: AclOperation,
    resource_type: ResourceType,
    items: Iterable[T],
    name_of: Callable[[T], str] = str,
) -> list[T]:
    """The items whose resource the principal may act on; the others are left out silently
    (Metadata of all topics, ListGroups, ListTransactions), as Kafka does."""
    if not enabled(session):
        return list(items)
    return [
        item
        for item in items
        if authorize(session, operation, resource_type, name_of(item), log_if_denied=False)
    ]


def authorize_by_resource_type(
    session: Session | None, operation: AclOperation, resource_type: ResourceType
) -> bool:
    """May the principal do `operation` on at least one resource of this type?"""
    if session is None or session.authorizer is None:
        return True
    return session.authorizer.authorize_by_resource_type(
        session.principal, session.host, operation, resource_type
    )


def authorized_operations(
    session: Session | None, resource_type: ResourceType, name: str = CLUSTER_NAME
) -> int:
    """Kafka's AuthHelper.authorizedOperations: a bit (1 << code) for each operation the
    resource's type supports that the principal may do on it (every one, without an
    authorizer); nothing logged, as Kafka's (a question, not a request)."""
    return sum(
        1 << operation.value
        for operation in SUPPORTED_OPERATIONS[resource_type]
        if authorize(session, operation, resource_type, name, log_if_denied=False)
    )


def failed(resource_type: ResourceType) -> ErrorCode:
    """The error a refusal on this resource type is answered with."""
    return AUTHORIZATION_FAILED[resource_type]
