"""AlterUserScramCredentials and DescribeUserScramCredentials as Kafka's controller
(ScramControlManager) and metadata cache decide them; sans-IO over the credential store.

A user appears once per alteration request (twice is DUPLICATE_RESOURCE for that user);
iterations must be within the mechanism's [4096, 16384]; deleting a credential that does not
exist is RESOURCE_NOT_FOUND. The client sends the salted password (never the password): the
broker keeps the stored and server keys derived from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from onceflow.security.credentials import CredentialStore
from onceflow.security.scram import BY_TYPE, ScramCredential, credential_from_salted

ALTERED_TWICE = "A user credential cannot be altered twice in the same request"


@dataclass(frozen=True)
class UserResult:
    user: str
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    credentials: tuple[tuple[int, int], ...] = ()  # (mechanism type, iterations), describe only


@dataclass
class Alteration:
    results: list[UserResult] = field(default_factory=list)
    upsertions: dict[tuple[str, str], ScramCredential] = field(default_factory=dict)
    deletions: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Deletion:
    name: str
    mechanism: int


@dataclass(frozen=True)
class Upsertion:
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


def plan_alteration(
    store: CredentialStore, deletions: list[Deletion], upsertions: list[Upsertion]
) -> Alteration:
    errors: dict[str, tuple[ErrorCode, str]] = {}
    deleting: dict[str, Deletion] = {}
    upserting: dict[str, Upsertion] = {}
    for deletion in deletions:
        if deletion.name in errors:
            continue
        if deleting.pop(deletion.name, None) is not None:
            errors[deletion.name] = (ErrorCode.duplicate_resource, ALTERED_TWICE)
            continue
        error = _check_name_and_mechanism(deletion.name, deletion.mechanism)
        if error is None and store.get(deletion.name, BY_TYPE[deletion.mechanism]) is None:
            error = (
                ErrorCode.resource_not_found,
                "Attempt to delete a user credential that does not exist",
            )
        if error is None:
            deleting[deletion.name] = deletion
        else:
            errors[deletion.name] = error
    for upsertion in upsertions:
        if upsertion.name in errors:
            continue
        if (
            deleting.pop(upsertion.name, None) is not None
            or upserting.pop(upsertion.name, None) is not None
        ):
            errors[upsertion.name] = (ErrorCode.duplicate_resource, ALTERED_TWICE)
            continue
        error = _check_upsertion(upsertion)
        if error is None:
            upserting[upsertion.name] = upsertion
        else:
            errors[upsertion.name] = error
    plan = Alteration()
    for deletion in deleting.values():
        plan.deletions.append((deletion.name, BY_TYPE[deletion.mechanism].name))
        plan.results.append(UserResult(deletion.name))
    for upsertion in upserting.values():
        mechanism = BY_TYPE[upsertion.mechanism]
        plan.upsertions[(upsertion.name, mechanism.name)] = credential_from_salted(
            mechanism, upsertion.salted_password, upsertion.salt, upsertion.iterations
        )
        plan.results.append(UserResult(upsertion.name))
    for user, (code, message) in errors.items():
        plan.results.append(UserResult(user, code, message))
    return plan


def describe(store: CredentialStore, users: list[str] | None) -> list[UserResult]:
    """Every user with credentials (users None or empty), else the ones asked for."""
    if not users:
        return [_described(store, user) for user in store.users()]
    results = []
    counts = Counter(users)  # not users.count per user: 25,000 names took 28 s
    for user in dict.fromkeys(users):
        if counts[user] > 1:
            results.append(
                UserResult(
                    user,
                    ErrorCode.duplicate_resource,
                    "Cannot describe SCRAM credentials for the same user twice in a single request",
                )
            )
        elif not store.credentials_of(user):
            results.append(
                UserResult(
                    user,
                    ErrorCode.resource_not_found,
                    f"Attempt to describe a user credential that does not exist: {user}",
                )
            )
        else:
            results.append(_described(store, user))
    return results


def _described(store: CredentialStore, user: str) -> UserResult:
    by_name = {m.name: m.type_id for m in BY_TYPE.values()}
    infos = tuple(
        (by_name[name], credential.iterations)
        for name, credential in sorted(store.credentials_of(user).items())
    )
    return UserResult(user, credentials=infos)


def _check_name_and_mechanism(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def _check_upsertion(upsertion: Upsertion) -> tuple[ErrorCode, str] | None:
    error = _check_name_and_mechanism(upsertion.name, upsertion.mechanism)
    if error is not None:
        return error
    mechanism = BY_TYPE[upsertion.mechanism]
    if upsertion.iterations < mechanism.min_iterations:
        return ErrorCode.unacceptable_credential, "Too few iterations"
    if upsertion.iterations > mechanism.max_iterations:
        return ErrorCode.unacceptable_credential, "Too many iterations"
    if not upsertion.salt or len(upsertion.salted_password) != mechanism.key_length:
        return ErrorCode.unacceptable_credential, "Salt or salted password is malformed"
    return None
