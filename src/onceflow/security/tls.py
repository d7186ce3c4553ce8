"""The broker's TLS context from Kafka's ssl.* settings (PEM key and trust stores).

As Kafka's DefaultSslEngineFactory: `ssl.keystore.location` holds the certificate chain and the
private key (`ssl.key.password` if it is encrypted); `ssl.truststore.location` the CA
certificates that client certificates are checked against; `ssl.client.auth` says whether a
client certificate is none (not asked for), requested or required. A certificate a client does
present is always verified, so an untrusted or expired one fails the handshake even where it
was only requested.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}


class TlsConfigError(ValueError):
    """TLS settings that cannot be used; the message is one line for the operator."""


@dataclass(frozen=True)
class TlsSettings:
    keystore_type: str
    keystore_location: str
    key_password: str
    truststore_type: str
    truststore_location: str
    client_auth: str
    enabled_protocols: str


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """An SSLContext for TLS listeners; raises TlsConfigError with what is wrong."""
    for name, kind in (
        ("ssl.keystore.type", settings.keystore_type),
        ("ssl.truststore.type", settings.truststore_type),
    ):
        if kind.upper() != "PEM":
            raise TlsConfigError(
                f"{name}={kind}: onceflow reads PEM files only (convert with openssl or keytool)"
            )
    client_auth = settings.client_auth.lower()
    if client_auth not in CLIENT_AUTH:
        raise TlsConfigError(
            f"ssl.client.auth={settings.client_auth}: expected none, requested or required"
        )
    if not settings.keystore_location:
        raise TlsConfigError(
            "an SSL or SASL_SSL listener needs ssl.keystore.location "
            "(a PEM file with the certificate chain and the private key)"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    versions = _enabled_versions(settings.enabled_protocols)
    context.minimum_version, context.maximum_version = min(versions), max(versions)
    try:
        context.load_cert_chain(settings.keystore_location, password=settings.key_password or None)
    except FileNotFoundError:
        raise TlsConfigError(
            f"ssl.keystore.location: {settings.keystore_location} does not exist"
        ) from None
    except (ssl.SSLError, OSError) as e:
        # Never the password itself: only that the key or certificate could not be read.
        raise TlsConfigError(
            f"ssl.keystore.location: cannot load the certificate chain and private key from "
            f"{settings.keystore_location} (wrong ssl.key.password, or not PEM?): {_reason(e)}"
        ) from None
    if settings.truststore_location:
        try:
            context.load_verify_locations(cafile=settings.truststore_location)
        except (ssl.SSLError, OSError) as e:
            raise TlsConfigError(
                f"ssl.truststore.location: cannot load CA certificates from "
                f"{settings.truststore_location}: {_reason(e)}"
            ) from None
    elif client_auth != "none":
        raise TlsConfigError(
            f"ssl.client.auth={client_auth} needs ssl.truststore.location "
            "(the CA certificates client certificates are checked against)"
        )
    context.verify_mode = CLIENT_AUTH[client_auth]
    return context


def _enabled_versions(value: str) -> list[ssl.TLSVersion]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in _PROTOCOLS]
    if unknown or not names:
        raise TlsConfigError(
            f"ssl.enabled.protocols={value}: onceflow supports {', '.join(_PROTOCOLS)}"
        )
    return [_PROTOCOLS[n] for n in names]


def _reason(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason)
    return getattr(error, "strerror", None) or str(error)
