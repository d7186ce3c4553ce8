"""What the broker's security needs at run time, built once from its settings: the listeners
and what each advertises, the TLS context of the TLS listeners, the SASL settings and the SCRAM
credential store; and a new Session per connection."""

from __future__ import annotations

import asyncio
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow.security.acl_store import AclStoreError, load_acls
from onceflow.security.authorizer import Authorizer, parse_super_users
from onceflow.security.credentials import CredentialStore, CredentialStoreError
from onceflow.security.listeners import Listener, ListenerError, advertised_endpoints
from onceflow.security.session import SaslSettings, Session
from onceflow.security.tls import TlsConfigError, TlsSettings, server_context

if TYPE_CHECKING:
    from onceflow.broker.config import BrokerConfig


class SecurityConfigError(ValueError):
    """Security settings the broker cannot start with; one line for the operator."""


@dataclass
class BrokerSecurity:
    listeners: list[Listener]
    advertised: dict[str, tuple[str, int]]  # listener name -> (host, port; 0 = bound port)
    tls: ssl.SSLContext | None
    sasl: SaslSettings
    credentials: CredentialStore
    # With `authorizer.class.name` set: the ACLs and their decisions (else everything allowed).
    authorizer: Authorizer | None = None
    data_dir: Path = Path()
    # AlterUserScramCredentials: one at a time, each planned against what the last one stored.
    credentials_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # CreateAcls and DeleteAcls likewise.
    acls_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def from_config(cls, config: BrokerConfig) -> BrokerSecurity:
        listeners = config.listener_list()
        try:
            advertised = advertised_endpoints(
                listeners, config.advertised_listener_list(), config.advertised_host
            )
            tls = None
            if any(listener.protocol.uses_tls for listener in listeners):
                tls = server_context(
                    TlsSettings(
                        keystore_type=config.ssl_keystore_type,
                        keystore_location=config.ssl_keystore_location,
                        key_password=config.ssl_key_password,
                        truststore_type=config.ssl_truststore_type,
                        truststore_location=config.ssl_truststore_location,
                        client_auth=config.ssl_client_auth,
                        enabled_protocols=config.ssl_enabled_protocols,
                    )
                )
            credentials = CredentialStore.open(Path(config.data_dir))
            authorizer = None
            if config.authorizer_enabled():
                authorizer = Authorizer(
                    load_acls(Path(config.data_dir)),
                    parse_super_users(config.super_users),
                    config.allow_everyone_if_no_acl_found,
                )
        except (ListenerError, TlsConfigError, CredentialStoreError, AclStoreError) as e:
            raise SecurityConfigError(str(e)) from None
        sasl = SaslSettings(
            enabled_mechanisms=config.enabled_mechanisms(),
            failed_authentication_delay_s=config.connection_failed_authentication_delay_ms / 1000,
            credentials=credentials,
        )
        return cls(listeners, advertised, tls, sasl, credentials, authorizer, Path(config.data_dir))

    def new_session(
        self, listener: Listener, peer: str, host: str, api_versions: tuple[int, int]
    ) -> Session:
        return Session(
            listener,
            peer,
            host,
            self.sasl if listener.protocol.uses_sasl else None,
            api_versions,
            authorizer=self.authorizer,
        )

    def advertised_endpoint(self, listener_name: str, bound_port: int) -> tuple[str, int]:
        """The host and port a client of this listener is told to connect to."""
        host, port = self.advertised[listener_name]
        if not host:
            host = socket.getfqdn()  # Kafka: an empty host advertises the canonical host name
        return host, port or bound_port
