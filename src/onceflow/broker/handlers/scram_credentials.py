"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51): the protocol edge of
the SCRAM credential store (onceflow.security.credential_changes decides, credentials.py
stores). An alteration is answered once it is on disk. DESCRIBE on the Cluster is needed to
describe, ALTER to alter (everything is allowed without an authorizer)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from onceflow.broker.handlers.responses import NO_THROTTLE, results_response
from onceflow.broker.handlers.slices import Work, in_slices
from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.messages import response_type
from onceflow.security import authorization as auth
from onceflow.security.credential_changes import (
    Deletion,
    Upsertion,
    UserResult,
    describe,
    plan_alteration,
)
from onceflow.security.credentials import CredentialStoreError

if TYPE_CHECKING:
    from onceflow.broker.handlers.context import SecurityContext
    from onceflow.protocol.messages import Request

log = logging.getLogger(__name__)

DESCRIBE_USER_SCRAM_CREDENTIALS = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS


def handle_describe(ctx: SecurityContext, request: Request) -> Any:
    cls = response_type(DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version)
    if not auth.authorize_cluster(request.session, auth.DESCRIBE):
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message=None,
            results=(),
        )
    users = None if request.body.users is None else [u.name for u in request.body.users]
    return in_slices(_described(ctx, cls, users), len(users or ()))


def _described(ctx: SecurityContext, cls: type, users: list[str] | None) -> Work:
    """One step per user named (the store's answer is read in one)."""
    result_cls = sibling(cls, "DescribeUserScramCredentialsResult")
    info_cls = sibling(cls, "CredentialInfo")
    out = []
    for r in describe(ctx.security.credentials, users):
        out.append(
            build(
                result_cls,
                user=r.user,
                error_code=r.error_code,
                error_message=r.error_message,
                credential_infos=tuple(
                    build(info_cls, mechanism=m, iterations=i) for m, i in r.credentials
                ),
            )
        )
        yield
    return build(
        cls,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(out),
    )


def handle_alter(ctx: SecurityContext, request: Request) -> Any:
    return _alter(ctx, request)


async def _alter(ctx: SecurityContext, request: Request) -> Any:
    body = request.body
    users = [d.name for d in body.deletions] + [u.name for u in body.upsertions]
    if not auth.authorize_cluster(request.session, auth.ALTER):
        results = [
            UserResult(user, ErrorCode.cluster_authorization_failed)
            for user in dict.fromkeys(users)
        ]
        return _alter_response(request, results)
    security = ctx.security
    # One alteration at a time: each plans against what the previous one stored.
    async with security.credentials_lock:
        store = security.credentials
        plan = plan_alteration(
            store,
            [Deletion(d.name, d.mechanism) for d in body.deletions],
            [
                Upsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password)
                for u in body.upsertions
            ],
        )
        if plan.upsertions or plan.deletions:
            table = store.changed(plan.upsertions, plan.deletions)
            try:
                await asyncio.to_thread(store.write, table)
            except CredentialStoreError as e:
                log.error("%s", e)
                failed = {user for user, _ in [*plan.upsertions, *plan.deletions]}
                plan.results = [
                    UserResult(r.user, ErrorCode.kafka_storage_error, str(e))
                    if r.user in failed
                    else r
                    for r in plan.results
                ]
            else:
                store.install(table)
                log.info(
                    "SCRAM credentials altered by %s: %s",
                    request.session.principal if request.session else "?",
                    ", ".join(f"{op} {user} {mechanism}" for op, user, mechanism in _changes(plan)),
                )
    return _alter_response(request, plan.results)


def _changes(plan: Any) -> list[tuple[str, str, str]]:
    return [("set", u, m) for u, m in plan.upsertions] + [
        ("deleted", u, m) for u, m in plan.deletions
    ]


def _alter_response(request: Request, results: list[UserResult]) -> Any:
    return results_response(request, "AlterUserScramCredentialsResult", results)
