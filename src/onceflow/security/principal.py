"""Who a connection is: Kafka's KafkaPrincipal, as DefaultKafkaPrincipalBuilder builds it.

PLAINTEXT, and SSL without a client certificate, are `User:ANONYMOUS`; SSL with a verified
client certificate is `User:` + its subject distinguished name as Java's X500Principal prints it
(RFC 2253, the default `ssl.principal.mapping.rules`); SASL is `User:` + the authenticated name.
An authorizer (the next phase) matches ACLs against this principal, the listener and the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USER_TYPE = "User"


@dataclass(frozen=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


def user(name: str) -> KafkaPrincipal:
    return KafkaPrincipal(USER_TYPE, name)


# The attribute keywords X500Principal.getName(RFC2253) prints by name (RFC 2253 section 2.3);
# keys are the names Python's ssl module gives them.
_RFC2253_KEYWORDS = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# Java prints other attributes as OID=#hex of their DER value; emailAddress is an IA5String.
_EMAIL_OID = "1.2.840.113549.1.9.1"
_IA5_STRING = 0x16


def distinguished_name(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """The RFC 2253 string of a subject from `SSLSocket.getpeercert()`: the most specific RDN
    first, a multi-valued RDN joined with '+', values escaped."""
    rdns = []
    for rdn in reversed(subject):
        rdns.append("+".join(_attribute(key, value) for key, value in rdn))
    return ",".join(rdns)


def certificate_principal(peer_cert: dict[str, Any] | None) -> KafkaPrincipal:
    """The principal of a TLS connection: its verified client certificate's subject, else
    ANONYMOUS (no certificate asked for or presented)."""
    if not peer_cert or not peer_cert.get("subject"):
        return ANONYMOUS
    return user(distinguished_name(peer_cert["subject"]))


def _attribute(key: str, value: str) -> str:
    keyword = _RFC2253_KEYWORDS.get(key)
    if keyword is not None:
        return f"{keyword}={_escape(value)}"
    if key == "emailAddress":
        encoded = value.encode("ascii", "replace")
        return f"{_EMAIL_OID}=#{_IA5_STRING:02x}{_der_length(len(encoded))}{encoded.hex()}"
    return f"{key}={_escape(value)}"


def _der_length(length: int) -> str:
    if length < 0x80:
        return f"{length:02x}"
    raw = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return f"{0x80 | len(raw):02x}{raw.hex()}"


def _escape(value: str) -> str:
    """RFC 2253 section 2.4: ,+"\\<>; always; '#' or ' ' first and ' ' last."""
    out = []
    for i, char in enumerate(value):
        if char in ',+"\\<>;' or (i == 0 and char in "# ") or (i == len(value) - 1 and char == " "):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)
