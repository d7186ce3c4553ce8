"""The SCRAM credential store: salt, iterations, stored and server keys per user and mechanism,
durable in the data directory (`scram-credentials.json`, replaced atomically and fsynced by
durable_file.py). Never a password.

The file is small and read whole at start; a change builds the new table, writes it (off the
event loop in the broker), and only then serves it, so what a client was told is on disk.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from onceflow.security.durable_file import (
    DurableFileError,
    load_json_store,
    write_json_atomically,
)
from onceflow.security.scram import ScramCredential, ScramMechanism

CREDENTIALS_FILE = "scram-credentials.json"
FORMAT_VERSION = 1

# user -> mechanism name -> credential
Table = dict[str, dict[str, ScramCredential]]


class CredentialStoreError(Exception):
    """The credential file cannot be read or written; one line for the operator."""


class CredentialStore:
    def __init__(self, data_dir: Path, table: Table) -> None:
        self.data_dir = data_dir
        self._table = table

    @classmethod
    def open(cls, data_dir: Path) -> CredentialStore:
        table = load_json_store(data_dir / CREDENTIALS_FILE, _decode_table, CredentialStoreError)
        return cls(data_dir, table)

    def get(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self._table.get(user, {}).get(mechanism.name)

    def credentials_of(self, user: str) -> dict[str, ScramCredential]:
        return dict(self._table.get(user, {}))

    def users(self) -> list[str]:
        return sorted(self._table)

    def changed(
        self,
        upsertions: Mapping[tuple[str, str], ScramCredential],
        deletions: list[tuple[str, str]],
    ) -> Table:
        """The table after these changes ((user, mechanism name) keys); not yet stored."""
        table = {user: dict(by_mechanism) for user, by_mechanism in self._table.items()}
        for user, mechanism in deletions:
            table.get(user, {}).pop(mechanism, None)
            if user in table and not table[user]:
                del table[user]
        for (user, mechanism), credential in upsertions.items():
            table.setdefault(user, {})[mechanism] = credential
        return table

    def write(self, table: Table) -> None:
        """Store `table` durably (blocking: a worker thread in the broker)."""
        payload = {
            "version": FORMAT_VERSION,
            "users": {
                user: {name: _encode(cred) for name, cred in sorted(by_mechanism.items())}
                for user, by_mechanism in sorted(table.items())
            },
        }
        try:
            write_json_atomically(self.data_dir / CREDENTIALS_FILE, payload)
        except DurableFileError as e:
            raise CredentialStoreError(str(e)) from e

    def install(self, table: Table) -> None:
        """Serve `table` (once written)."""
        self._table = table


def _encode(credential: ScramCredential) -> dict[str, Any]:
    return {
        "salt": base64.b64encode(credential.salt).decode(),
        "stored_key": base64.b64encode(credential.stored_key).decode(),
        "server_key": base64.b64encode(credential.server_key).decode(),
        "iterations": credential.iterations,
    }


def _decode_table(raw: dict[str, Any]) -> Table:
    return {
        user: {name: _decode(cred) for name, cred in by_mechanism.items()}
        for user, by_mechanism in raw.get("users", {}).items()
    }


def _decode(raw: dict[str, Any]) -> ScramCredential:
    return ScramCredential(
        salt=base64.b64decode(raw["salt"]),
        stored_key=base64.b64decode(raw["stored_key"]),
        server_key=base64.b64decode(raw["server_key"]),
        iterations=int(raw["iterations"]),
    )
