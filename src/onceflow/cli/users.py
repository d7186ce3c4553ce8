"""`onceflow users`: set, list and delete SCRAM users, as `kafka-configs --entity-type users`
and `kafka-storage format --add-scram` do.

With `--data-dir` the tool works on a stopped broker's data directory (a new or empty one is
initialised, meta.properties included, so that the first admin exists before the first start);
otherwise it asks a running broker (AlterUserScramCredentials, DescribeUserScramCredentials)
through confluent-kafka. The password is read from a file (or stdin with `-`), never from the
command line, and only its salted derivation is stored.
"""

from __future__ import annotations

import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated

import typer
from confluent_kafka import KafkaException, admin
from confluent_kafka.admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from onceflow.broker.data_dir import META_PROPERTIES, DataDirError, open_data_dir, read_properties
from onceflow.cli.options import cluster_command
from onceflow.security.credentials import CredentialStore, CredentialStoreError, Table
from onceflow.security.scram import DEFAULT_ITERATIONS, MECHANISMS, ScramMechanism, new_credential
from onceflow.tools.clients import Cluster, connect_admin, result_of
from onceflow.tools.errors import CliError, UsageError, kafka_error_text
from onceflow.tools.output import result_table, stdout_console

users_app = typer.Typer(
    help="Set, list and delete SASL/SCRAM users (PLAIN checks the same credentials).",
    no_args_is_help=True,
    add_completion=False,
)

UserName = Annotated[str, typer.Argument(metavar="NAME", help="User name.")]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Work on this (stopped) broker's data directory instead of a running broker.",
    ),
]
OptionalBootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-server",
        "-b",
        metavar="HOST:PORT",
        help="A running broker to ask [127.0.0.1:9092].",
    ),
]
Mechanism = Annotated[
    str,
    typer.Option("--mechanism", help="SCRAM-SHA-256 or SCRAM-SHA-512."),
]
_CONFLUENT_MECHANISMS = {
    "SCRAM-SHA-256": admin.ScramMechanism.SCRAM_SHA_256,
    "SCRAM-SHA-512": admin.ScramMechanism.SCRAM_SHA_512,
}


@users_app.command("set")
@cluster_command(OptionalBootstrap, None)
def set_user(
    cluster: Cluster,
    name: UserName,
    password_file: Annotated[
        Path,
        typer.Option("--password-file", help="File whose first line is the password ('-': stdin)."),
    ],
    mechanism: Mechanism = "SCRAM-SHA-256",
    iterations: Annotated[
        int, typer.Option("--iterations", help="PBKDF2 iterations, 4096 to 16384.")
    ] = DEFAULT_ITERATIONS,
    data_dir: DataDir = None,
) -> None:
    """Create a user or change its password for one mechanism."""
    scram = _mechanism(mechanism)
    _check_name(name)
    if not scram.min_iterations <= iterations <= scram.max_iterations:
        raise UsageError(
            f"--iterations {iterations}: must be between {scram.min_iterations} and "
            f"{scram.max_iterations} (Kafka's bounds)."
        )
    password = _read_password(password_file)
    if _offline(data_dir, cluster):
        assert data_dir is not None
        store = _open_store(data_dir)
        credential = new_credential(scram, password, iterations)
        _store(store, store.changed({(name, scram.name): credential}, []))
        typer.echo(f"Set {scram.name} credentials of user {name!r} in {data_dir}.")
        return
    session = connect_admin(cluster)
    info = ScramCredentialInfo(_CONFLUENT_MECHANISMS[scram.name], iterations)
    futures = session.admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(name, info, password.encode())]
    )
    _results(futures, "Setting credentials")
    typer.echo(f"Set {scram.name} credentials of user {name!r}.")


@users_app.command("list")
@cluster_command(OptionalBootstrap, None)
def list_users(
    cluster: Cluster,
    data_dir: DataDir = None,
) -> None:
    """List users and their mechanisms (iterations), never a secret."""
    rows: list[tuple[str, str, int]] = []
    if _offline(data_dir, cluster):
        assert data_dir is not None
        store = _open_store(data_dir, create=False)
        for user in store.users():
            for mechanism, credential in sorted(store.credentials_of(user).items()):
                rows.append((user, mechanism, credential.iterations))
    else:
        session = connect_admin(cluster)
        try:
            described = result_of(session.admin.describe_user_scram_credentials(), "Listing users")
        except KafkaException as e:
            raise CliError(f"Listing users failed: {kafka_error_text(e)}") from None
        for user, description in sorted(described.items()):
            for info in description.scram_credential_infos:
                rows.append((user, _mechanism_name(info.mechanism), info.iterations))
    table = result_table("USER", "MECHANISM", "ITERATIONS", right_from=2)
    # Sorted: Kafka answers a user's mechanisms in its own order (SHA-512 first), onceflow not.
    for user, mechanism, iterations in sorted(rows):
        table.add_row(user, mechanism, str(iterations))
    stdout_console().print(table)


@users_app.command("delete")
@cluster_command(OptionalBootstrap, None)
def delete_user(
    cluster: Cluster,
    name: UserName,
    mechanism: Annotated[
        str | None,
        typer.Option("--mechanism", help="Only this mechanism's credentials [all of them]."),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Delete a user's credentials (of one mechanism, or all)."""
    names = [_mechanism(mechanism).name] if mechanism else list(MECHANISMS)
    if _offline(data_dir, cluster):
        assert data_dir is not None
        store = _open_store(data_dir, create=False)
        present = [m for m in names if m in store.credentials_of(name)]
        if not present:
            raise CliError(f"User {name!r} has no {' or '.join(names)} credentials.")
        _store(store, store.changed({}, [(name, m) for m in present]))
        typer.echo(f"Deleted {', '.join(present)} credentials of user {name!r}.")
        return
    session = connect_admin(cluster)
    try:
        described = result_of(
            session.admin.describe_user_scram_credentials([name])[name], "Describing the user"
        )
    except KafkaException as e:
        raise CliError(f"User {name!r}: {kafka_error_text(e)}") from None
    present = [
        _mechanism_name(i.mechanism)
        for i in described.scram_credential_infos
        if _mechanism_name(i.mechanism) in names
    ]
    if not present:
        raise CliError(f"User {name!r} has no {' or '.join(names)} credentials.")
    # One user per request (Kafka refuses a user altered twice in one), so one per mechanism.
    for m in present:
        _results(
            session.admin.alter_user_scram_credentials(
                [UserScramCredentialDeletion(name, _CONFLUENT_MECHANISMS[m])]
            ),
            "Deleting credentials",
        )
    typer.echo(f"Deleted {', '.join(present)} credentials of user {name!r}.")


def _offline(data_dir: Path | None, cluster: Cluster) -> bool:
    if data_dir is not None and cluster.bootstrap is not None:
        raise UsageError("Give --data-dir (a stopped broker) or --bootstrap-server, not both.")
    return data_dir is not None


def _mechanism(name: str) -> ScramMechanism:
    mechanism = MECHANISMS.get(name.upper())
    if mechanism is None:
        raise UsageError(f"--mechanism {name}: expected {' or '.join(MECHANISMS)}.")
    return mechanism


def _mechanism_name(mechanism: object) -> str:
    for name, value in _CONFLUENT_MECHANISMS.items():
        if value == mechanism:
            return name
    return str(mechanism)


def _check_name(name: str) -> None:
    if not name or name != name.strip():
        raise UsageError(f"User name {name!r}: must be non-empty, without surrounding spaces.")


def _read_password(path: Path) -> str:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as e:
        raise UsageError(f"--password-file {path}: {e.strerror or e}.") from None
    except UnicodeDecodeError:
        raise UsageError(f"--password-file {path}: not UTF-8 text.") from None
    lines = text.splitlines()
    password = lines[0] if lines else ""
    if not password:
        raise UsageError(f"--password-file {path}: the first line (the password) is empty.")
    return password


def _open_store(data_dir: Path, *, create: bool = True) -> CredentialStore:
    meta = data_dir / META_PROPERTIES
    if not create and not meta.exists():
        raise CliError(f"{data_dir} is not an onceflow data directory (no {META_PROPERTIES}).")
    try:
        node_id = int(read_properties(meta).get("node.id", "0")) if meta.exists() else 0
        open_data_dir(data_dir, node_id)  # a new or empty directory is initialised
        return CredentialStore.open(data_dir)
    except (DataDirError, CredentialStoreError, ValueError, OSError) as e:
        raise CliError(str(e)) from None


def _store(store: CredentialStore, table: Table) -> None:
    try:
        store.write(table)
    except CredentialStoreError as e:
        raise CliError(str(e)) from None


def _results(futures: dict[str, Future[None]], what: str) -> None:
    for user, future in futures.items():
        try:
            result_of(future, what)
        except KafkaException as e:
            raise CliError(f"{what} of user {user!r} failed: {kafka_error_text(e)}") from None
