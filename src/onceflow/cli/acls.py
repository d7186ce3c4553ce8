"""`onceflow acls`: add, list and remove ACLs, as `kafka-acls.sh --add|--list|--remove` does,
with its flags and meanings (tools/.../AclCommand.java in Apache Kafka):

- the resources: `--topic`, `--group`, `--transactional-id` (each repeatable, `*` for all) and
  `--cluster`, under `--resource-pattern-type` (literal by default; prefixed; any and match
  as filters for list and remove);
- the entries: the cross product of the principals (`--allow-principal`, `--deny-principal`),
  their hosts (`--allow-host`, `--deny-host`, `*` by default) and the operations (`--operation`,
  All by default);
- `--producer` and `--consumer`, which name the operations a producer or a consumer needs.

The requests go through confluent-kafka's AdminClient (CreateAcls, DescribeAcls, DeleteAcls),
so the commands work against any Kafka cluster with an authorizer.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaError, KafkaException, admin

from onceflow.cli.options import Command, cluster_command, command_group, option, option_group
from onceflow.kafka_errors import kafka_error_code
from onceflow.security.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclError,
    AclOperation,
    PatternType,
    PermissionType,
    ResourcePattern,
    ResourceType,
    parse_principal,
)
from onceflow.tools.clients import AdminSession, connect_admin, result_of
from onceflow.tools.clients import Cluster as KafkaCluster
from onceflow.tools.errors import CliError, UsageError, kafka_error_text
from onceflow.tools.output import note, result_table, stdout_console

acls_app = command_group("Add, list and remove ACLs (as kafka-acls does).")

# A pattern's fields also serve as a filter's: ANY and MATCH as its pattern type.
ResourceFilter = ResourcePattern
# Entries per resource; an empty set (remove only) stands for every entry of the resource.
ResourceAcls = dict[ResourceFilter, frozenset[AccessControlEntry]]

_PRODUCER_TOPIC = (AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE)
_PRODUCER_TRANSACTIONAL_ID = (AclOperation.WRITE, AclOperation.DESCRIBE)
_CONSUMER_TOPIC = (AclOperation.READ, AclOperation.DESCRIBE)
_CONSUMER_GROUP = (AclOperation.READ,)
_CLUSTER = ResourceFilter(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL)


def _many(flag: str, metavar: str, help_text: str) -> Any:
    return Annotated[list[str] | None, typer.Option(flag, metavar=metavar, help=help_text)]


def _flag(flag: str, help_text: str) -> Any:
    return Annotated[bool, typer.Option(flag, help=help_text)]


Topics = _many("--topic", "TOPIC", "A topic ('*': every topic); repeatable.")
Groups = _many("--group", "GROUP", "A consumer group ('*': every group); repeatable.")
TransactionalIds = _many(
    "--transactional-id", "ID", "A transactional id ('*': every one); repeatable."
)
Cluster = _flag("--cluster", "The cluster resource.")
PatternTypeOption = Annotated[
    str,
    typer.Option(
        "--resource-pattern-type",
        metavar="TYPE",
        help="literal or prefixed; list and remove also take the filters any (every pattern "
        "type, this exact name) and match (every pattern that applies to the name).",
    ),
]
AllowPrincipals = _many("--allow-principal", "TYPE:NAME", "Principal allowed (User:alice).")
DenyPrincipals = _many("--deny-principal", "TYPE:NAME", "Principal denied (deny wins).")
AllowHosts = _many("--allow-host", "HOST", "Host of the allowed principals [*].")
DenyHosts = _many("--deny-host", "HOST", "Host of the denied principals [*].")
Operations = _many("--operation", "OPERATION", "Read, Write, Create, Describe, ...; [All].")
Producer = _flag(
    "--producer", "Write, Describe, Create on the topics (Write, Describe on the ids)."
)
Consumer = _flag("--consumer", "Read, Describe on the topics, Read on the groups.")
Idempotent = _flag("--idempotent", "With --producer: IdempotentWrite on the cluster.")
Force = _flag("--force", "Do not ask for confirmation.")
Principals = _many("--principal", "TYPE:NAME", "Only the ACLs of this principal; repeatable.")


@dataclass(frozen=True)
class Resources:
    """The resource options of a command."""

    topics: Sequence[str]
    groups: Sequence[str]
    transactional_ids: Sequence[str]
    cluster: bool
    pattern_type: PatternType

    def filters(self, *, required: bool, idempotent: bool = False) -> list[ResourceFilter]:
        """One filter per named resource. As kafka-acls, the cluster is only ever LITERAL
        (`--cluster` is ignored under another pattern type)."""
        kind = self.pattern_type
        found = [ResourceFilter(ResourceType.TOPIC, t.strip(), kind) for t in self.topics]
        if kind == PatternType.LITERAL and (self.cluster or idempotent):
            found.append(_CLUSTER)
        found += [ResourceFilter(ResourceType.GROUP, g.strip(), kind) for g in self.groups]
        found += [
            ResourceFilter(ResourceType.TRANSACTIONAL_ID, t, kind) for t in self.transactional_ids
        ]
        if required and not found:
            raise UsageError(
                "You must provide at least one resource: --topic, --group, "
                "--transactional-id or --cluster."
            )
        return list(dict.fromkeys(found))


@dataclass(frozen=True)
class Access:
    """The principal, host and operation options of add and remove."""

    allow_principals: Sequence[str]
    deny_principals: Sequence[str]
    allow_hosts: Sequence[str]
    deny_hosts: Sequence[str]
    operations: Sequence[str] | None  # None: not given (All, or what --producer implies)

    def entries(self, operations: Iterable[AclOperation]) -> frozenset[AccessControlEntry]:
        """Every principal with every host and every operation, allowed then denied."""
        sides = (
            (PermissionType.ALLOW, self.allow_principals, self.allow_hosts),
            (PermissionType.DENY, self.deny_principals, self.deny_hosts),
        )
        operations = list(operations)
        return frozenset(
            AccessControlEntry(principal, host, operation, permission)
            for permission, principals, hosts in sides
            for principal in _principals(principals)
            for host in _hosts(hosts, principals)
            for operation in operations
        )

    def named_operations(self) -> list[AclOperation]:
        if not self.operations:
            return [AclOperation.ALL]
        return [_operation(text) for text in self.operations]


def resource_acls(
    resources: Resources, access: Access, *, producer: bool, consumer: bool, idempotent: bool
) -> ResourceAcls:
    """What add creates or remove deletes, per resource (kafka-acls' getResourceFilterToAcls)."""
    _check_roles(resources, access, producer=producer, consumer=consumer, idempotent=idempotent)
    wanted: dict[ResourceFilter, frozenset[AccessControlEntry]] = {}
    filters = resources.filters(required=True, idempotent=idempotent)
    roles: list[tuple[ResourceType, tuple[AclOperation, ...]]] = []
    if producer:
        roles += [
            (ResourceType.TOPIC, _PRODUCER_TOPIC),
            (ResourceType.TRANSACTIONAL_ID, _PRODUCER_TRANSACTIONAL_ID),
        ]
        if idempotent:
            wanted[_CLUSTER] = access.entries([AclOperation.IDEMPOTENT_WRITE])
    if consumer:
        roles += [(ResourceType.TOPIC, _CONSUMER_TOPIC), (ResourceType.GROUP, _CONSUMER_GROUP)]
    if not producer and not consumer:
        entries = access.entries(access.named_operations())
        wanted.update((f, entries) for f in filters)
    for resource_type, operations in roles:
        for f in filters:
            if f.resource_type == resource_type:
                wanted[f] = wanted.get(f, frozenset()) | access.entries(operations)
    for f, entries in wanted.items():
        _check_operations(f.resource_type, entries)
    return wanted


def _check_roles(
    resources: Resources, access: Access, *, producer: bool, consumer: bool, idempotent: bool
) -> None:
    if (producer or consumer) and (
        access.operations or access.deny_principals or access.deny_hosts
    ):
        raise UsageError(
            "--producer and --consumer take no --operation, --deny-principal or --deny-host."
        )
    if idempotent and not producer:
        raise UsageError("The --idempotent option is only available with --producer.")
    if producer and not resources.topics:
        raise UsageError("With --producer you must specify a --topic.")
    named_other = resources.cluster or bool(resources.transactional_ids)
    if consumer and (
        not resources.topics or not resources.groups or (not producer and named_other)
    ):
        raise UsageError(
            "With --consumer you must specify a --topic and a --group, and no --cluster or "
            "--transactional-id."
        )


def _check_operations(resource_type: ResourceType, entries: Iterable[AccessControlEntry]) -> None:
    valid = SUPPORTED_OPERATIONS[resource_type] | {AclOperation.ALL}
    if any(entry.operation not in valid for entry in entries):
        names = ", ".join(sorted(op.camel() for op in valid))
        raise UsageError(f"ResourceType {resource_type.camel()} only supports operations {names}.")


def _operation(text: str) -> AclOperation:
    try:
        return AclOperation.parse(text)
    except AclError:
        names = ", ".join(op.camel() for op in AclOperation if op.value > AclOperation.ANY)
        raise UsageError(f"Invalid --operation {text!r}: expected one of {names}.") from None


def _principals(values: Iterable[str]) -> list[str]:
    principals = []
    for text in values:
        try:
            principals.append(str(parse_principal(text.strip())))
        except AclError:
            raise UsageError(
                f"Invalid principal {text!r}: expected TYPE:NAME, as User:alice."
            ) from None
    return principals


def _hosts(hosts: Sequence[str], principals: Sequence[str]) -> list[str]:
    """The hosts given, or `*` for principals given without hosts."""
    if hosts:
        return [host.strip() for host in hosts]
    return [WILDCARD] if principals else []


def pattern_type(text: str, *, filters: bool) -> PatternType:
    """`--resource-pattern-type`: literal or prefixed, or (filters) any or match."""
    allowed = ["literal", "prefixed"] + (["any", "match"] if filters else [])
    if text.strip().lower() not in allowed:
        action = "listing or removing" if filters else "adding"
        raise UsageError(
            f"A --resource-pattern-type of {text!r} is not valid when {action} ACLs: "
            f"expected {' or '.join(allowed)}."
        )
    return PatternType[text.strip().upper()]


# --- the commands -------------------------------------------------------------------------


def resource_options(*, filters: bool) -> Callable[[Command], Command]:
    """kafka-acls' resource options (--topic, --group, --transactional-id, --cluster,
    --resource-pattern-type, first in every command), given to the command as `resources`."""

    def resources(
        resource_pattern_type: str, cluster: bool, **named: list[str] | None
    ) -> Resources:
        kind = pattern_type(resource_pattern_type, filters=filters)
        topics, groups, ids = (named[key] or [] for key in ("topic", "group", "transactional_id"))
        return Resources(topics, groups, ids, cluster, kind)

    return option_group(
        "resources",
        [
            option("topic", Topics),
            option("group", Groups),
            option("transactional_id", TransactionalIds),
            option("cluster", Cluster, False),
            option("resource_pattern_type", PatternTypeOption, "literal"),
        ],
        resources,
        first=True,
    )


# add and remove: the principals, hosts and operations of the ACL entries.
access_options = option_group(
    "access",
    [
        option("allow_principal", AllowPrincipals),
        option("deny_principal", DenyPrincipals),
        option("allow_host", AllowHosts),
        option("deny_host", DenyHosts),
        option("operation", Operations),
    ],
    lambda allow_principal, deny_principal, allow_host, deny_host, operation: Access(
        allow_principal or [], deny_principal or [], allow_host or [], deny_host or [], operation
    ),
    first=True,
)


def _changing_command(removing: bool) -> Any:
    """`acls add` or `acls remove`: the same options, as kafka-acls' --add and --remove."""

    @cluster_command(into="target")  # `cluster` is the --cluster resource flag here
    @resource_options(filters=removing)
    @access_options
    def command(
        target: KafkaCluster,
        resources: Resources,
        access: Access,
        producer: Producer = False,
        consumer: Consumer = False,
        idempotent: Idempotent = False,
        force: Force = False,
    ) -> None:
        wanted = resource_acls(
            resources, access, producer=producer, consumer=consumer, idempotent=idempotent
        )
        if removing:
            _remove(connect_admin(target), wanted, force)
            return
        if any(not entries for entries in wanted.values()):
            raise UsageError(
                "You must specify one of: --allow-principal, --deny-principal when adding ACLs."
            )
        _add(connect_admin(target), wanted)

    command.__doc__ = (
        "Remove ACLs: those named, or every ACL of the resources if no principal is given."
        if removing
        else "Add ACLs: every principal x host x operation given, on every resource given."
    )
    return command


acls_app.command("add")(_changing_command(removing=False))


@acls_app.command("list")
@cluster_command(into="target")
@resource_options(filters=True)
def list_acls(target: KafkaCluster, resources: Resources, principal: Principals = None) -> None:
    """List ACLs: all of them, or those of the resources (and principals) given."""
    filters: list[ResourceFilter | None] = [*resources.filters(required=False)] or [None]
    principals: list[str | None] = list(_principals(principal or [])) or [None]
    session = connect_admin(target)
    found: set[AclBinding] = set()
    for resource in filters:
        for who in principals:
            acl_filter = _confluent_filter(resource, who)
            found.update(
                _from_confluent(b)
                for b in _answer(session.admin.describe_acls(acl_filter), "Listing ACLs")
            )
    if not found:
        _explain_empty(session)
    table = result_table(
        "RESOURCE TYPE", "NAME", "PATTERN TYPE", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION"
    )
    for b in sorted(found):
        pattern, entry = b.pattern, b.entry
        table.add_row(
            pattern.resource_type.name,
            pattern.name,
            pattern.pattern_type.name,
            entry.principal,
            entry.host,
            entry.operation.name,
            entry.permission_type.name,
        )
    stdout_console().print(table)


acls_app.command("remove")(_changing_command(removing=True))


def _add(session: AdminSession, wanted: ResourceAcls) -> None:
    """Create what does not exist yet, one line per binding (kafka-acls says which exist)."""
    new: list[AclBinding] = []
    for resource, entries in sorted(wanted.items()):
        existing = {
            _from_confluent(b)
            for b in _answer(
                session.admin.describe_acls(_confluent_filter(resource, None)), "Listing ACLs"
            )
        }
        for entry in sorted(entries):
            binding = AclBinding(resource, entry)
            if binding in existing:
                typer.echo(f"ACL {entry} on {resource} already exists.")
            else:
                new.append(binding)
    if not new:
        return
    futures = session.admin.create_acls([_to_confluent(b) for b in new])
    for binding, future in zip(new, futures.values(), strict=True):
        _answer(future, "Adding ACLs")
        typer.echo(f"Added ACL {binding.entry} on {binding.pattern}.")


def _remove(session: AdminSession, wanted: ResourceAcls, force: bool) -> None:
    """Delete per resource filter, after a yes (or --force), one line per binding removed."""
    confirmed: list[tuple[ResourceFilter, frozenset[AccessControlEntry]]] = []
    for resource, entries in sorted(wanted.items()):
        what = [f"  {entry}" for entry in sorted(entries)] or ["  every ACL of it"]
        question = "\n".join([f"From {_filter_text(resource)}, remove:", *what, "Remove them?"])
        if force or _confirm(question):
            confirmed.append((resource, entries))
    if not confirmed:
        note("Nothing removed.")
        return
    filters = [
        _confluent_filter(resource, None, entry)
        for resource, entries in confirmed
        for entry in (sorted(entries) or [None])
    ]
    removed: set[AclBinding] = set()
    for future in session.admin.delete_acls(filters).values():
        removed.update(_from_confluent(deleted) for deleted in _answer(future, "Removing ACLs"))
    # Sorted as list prints them: Kafka answers in its own (hash) order, onceflow in another.
    for binding in sorted(removed):
        typer.echo(f"Removed ACL {binding.entry} on {binding.pattern}.")
    if not removed:
        note("No ACL matched.")


def _explain_empty(session: AdminSession) -> None:
    """Why a listing may be empty. librdkafka drops DescribeAcls' error code (an empty list
    either way), so ask with a DeleteAcls that can match nothing: it answers SECURITY_DISABLED
    without an authorizer (CliError), and CLUSTER_AUTHORIZATION_FAILED without ALTER on the
    Cluster, which says nothing certain about DESCRIBE, the right listing needs (a note)."""
    unique = uuid.uuid4().hex
    nothing = admin.AclBindingFilter(
        admin.ResourceType.TOPIC,
        f"onceflow probe {unique}",  # not a topic name, and a principal and host no ACL has
        admin.ResourcePatternType.LITERAL,
        f"User:probe-{unique}",
        unique,
        admin.AclOperation.ANY,
        admin.AclPermissionType.ANY,
    )
    for future in session.admin.delete_acls([nothing]).values():
        try:
            result_of(future, "Listing ACLs")
        except KafkaException as e:
            if kafka_error_code(e) != KafkaError.CLUSTER_AUTHORIZATION_FAILED:
                _answer(future, "Listing ACLs")  # raises its one line
            note(
                "No ACLs listed. This principal may not change ACLs (no ALTER on the Cluster); "
                "if it may not DESCRIBE the Cluster either, the broker refused to list them "
                "(librdkafka does not report that refusal)."
            )


def _confirm(question: str) -> bool:
    """A yes from stdin, the question on stderr (stdout holds only results)."""
    print(f"{question} [y/N]: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not answer:  # end of input: nobody to ask
        print(file=sys.stderr)
        raise UsageError("Removing ACLs needs a yes: answer the question or give --force.")
    return answer.strip().lower() in ("y", "yes")


def _filter_text(resource: ResourceFilter) -> str:
    name = "every name" if resource.name is None else resource.name
    return f"{resource.resource_type.camel()}:{resource.pattern_type.name}:{name}"


# --- confluent-kafka's types (the same wire codes as onceflow.security.acl's enums) -------


def _to_confluent(binding: AclBinding) -> admin.AclBinding:
    pattern, entry = binding.pattern, binding.entry
    return admin.AclBinding(
        admin.ResourceType(pattern.resource_type.value),
        pattern.name,
        admin.ResourcePatternType(pattern.pattern_type.value),
        entry.principal,
        entry.host,
        admin.AclOperation(entry.operation.value),
        admin.AclPermissionType(entry.permission_type.value),
    )


def _confluent_filter(
    resource: ResourceFilter | None,
    principal: str | None,
    entry: AccessControlEntry | None = None,
) -> admin.AclBindingFilter:
    """A filter on the resource (None: every one), and on the entry if given (else on the
    principal if given)."""
    any_resource = ResourceFilter(ResourceType.ANY, WILDCARD, PatternType.ANY)
    return admin.AclBindingFilter(
        admin.ResourceType((resource or any_resource).resource_type.value),
        resource.name if resource else None,
        admin.ResourcePatternType((resource or any_resource).pattern_type.value),
        entry.principal if entry else principal,
        entry.host if entry else None,
        admin.AclOperation(entry.operation.value if entry else AclOperation.ANY.value),
        admin.AclPermissionType(entry.permission_type.value if entry else PermissionType.ANY.value),
    )


def _from_confluent(binding: admin.AclBinding) -> AclBinding:
    return AclBinding.from_codes(
        binding.restype.value,
        binding.name,
        binding.resource_pattern_type.value,
        binding.principal,
        binding.host,
        binding.operation.value,
        binding.permission_type.value,
    )


def _answer(future: Any, what: str) -> Any:
    """An ACL request's result; its refusals as one clear line."""
    try:
        return result_of(future, what)
    except KafkaException as e:
        code = kafka_error_code(e)
        if code == KafkaError.SECURITY_DISABLED:
            raise CliError(
                f"{what}: the broker has no authorizer (authorizer.class.name is not set), "
                "so it keeps no ACLs (SECURITY_DISABLED)."
            ) from None
        if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            raise CliError(
                f"{what}: not authorized; this needs ALTER on the Cluster to change ACLs, "
                "DESCRIBE to list them (CLUSTER_AUTHORIZATION_FAILED)."
            ) from None
        raise CliError(f"{what} failed: {kafka_error_text(e)}") from None
