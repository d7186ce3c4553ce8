"""Certificates made at test time (trustme): a CA the broker trusts, a server certificate for
127.0.0.1/localhost, client certificates (good, expired, from an untrusted CA)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization

KEY_PASSWORD = "keystore-secret"


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA certificate (clients' ssl.ca.location; the broker's truststore)
    keystore: Path  # the broker's certificate chain and encrypted private key
    client_cert: Path
    client_key: Path
    client_dn: str  # the principal Kafka gives the client certificate
    expired_cert: Path
    expired_key: Path
    untrusted_cert: Path
    untrusted_key: Path


def make_certs(directory: Path) -> Certs:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="onceflow tests")
    server = ca.issue_cert("127.0.0.1", "localhost")
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
    )
    keystore = directory / "broker.pem"
    keystore.write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems) + encrypted)
    ca_path = directory / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    client = ca.issue_cert(
        "client.example",
        common_name="alice",
        organization_name="Acme, Inc",
        organization_unit_name="eng",
    )
    now = datetime.datetime.now(datetime.UTC)
    expired = ca.issue_cert(
        "expired.example",
        common_name="old",
        not_before=now - datetime.timedelta(days=10),
        not_after=now - datetime.timedelta(days=1),
    )
    untrusted = trustme.CA().issue_cert("mallory.example", common_name="mallory")
    paths = {}
    for name, leaf in (("client", client), ("expired", expired), ("untrusted", untrusted)):
        cert, key_path = directory / f"{name}.crt", directory / f"{name}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(key_path))
        paths[name] = (cert, key_path)
    return Certs(
        ca=ca_path,
        keystore=keystore,
        client_cert=paths["client"][0],
        client_key=paths["client"][1],
        client_dn="CN=alice,OU=eng,O=Acme\\, Inc",
        expired_cert=paths["expired"][0],
        expired_key=paths["expired"][1],
        untrusted_cert=paths["untrusted"][0],
        untrusted_key=paths["untrusted"][1],
    )


def broker_tls_settings(certs: Certs, client_auth: str = "requested") -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.keystore),
        "ssl.key.password": KEY_PASSWORD,
        "ssl.truststore.location": str(certs.ca),
        "ssl.client.auth": client_auth,
    }
