"""Client settings from a Kafka properties file (`--command-config FILE`, as Kafka's tools).

The file holds what a Kafka user already has in a client.properties: `key=value` lines (or
`key: value`, or `key value`), `#` and `!` comments, blank lines. onceflow's clients are
librdkafka's, so the Java client's names that librdkafka spells differently are translated:

- `sasl.jaas.config` (PlainLoginModule or ScramLoginModule, `username="..." password="..."`)
  gives `sasl.username` and `sasl.password`;
- `ssl.truststore.location` of type PEM gives `ssl.ca.location`;
- `ssl.keystore.location` of type PEM (certificate chain and key in one file) gives
  `ssl.certificate.location` and `ssl.key.location`; `ssl.keystore.password` is not needed;
- `ssl.endpoint.identification.algorithm=` (empty: no host name check) gives `none`.

Any other key goes to librdkafka as it is; one librdkafka does not know is an error naming it.
No value is ever put in an error message: passwords live in these files.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from onceflow.librdkafka_log import QUIET


class ClientPropertiesError(ValueError):
    """A properties file that cannot be read or used; the message names the file and key."""


_JAAS_MODULES = (
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_PEM_ONLY = "ssl.truststore.type", "ssl.keystore.type"
_DROPPED = ("ssl.keystore.password",)  # a PEM keystore's key is protected by ssl.key.password


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """`key=value` pairs of a Java properties text (no line continuations or escapes)."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            raise ClientPropertiesError(f"{source}, line {number}: want key=value")
        out[match.group(1)] = match.group(2).strip()
    return out


def librdkafka_settings(properties: Mapping[str, str], source: str) -> dict[str, str]:
    """The Java client's names translated to librdkafka's (see the module docstring)."""
    settings = dict(properties)
    for key in _PEM_ONLY:
        kind = settings.pop(key, "PEM")
        if kind.upper() != "PEM":
            raise ClientPropertiesError(f"{source}: {key}={kind} is not supported (only PEM)")
    for key in _DROPPED:
        settings.pop(key, None)
    jaas = settings.pop("sasl.jaas.config", None)
    if jaas is not None:
        if not any(module in jaas for module in _JAAS_MODULES):
            raise ClientPropertiesError(
                f"{source}: sasl.jaas.config: only PlainLoginModule and ScramLoginModule"
            )
        options = dict(_JAAS_OPTION.findall(jaas))
        if "username" not in options or "password" not in options:
            raise ClientPropertiesError(
                f'{source}: sasl.jaas.config needs username="..." and password="..."'
            )
        settings.setdefault("sasl.username", options["username"])
        settings.setdefault("sasl.password", options["password"])
    truststore = settings.pop("ssl.truststore.location", None)
    if truststore is not None:
        settings.setdefault("ssl.ca.location", truststore)
    keystore = settings.pop("ssl.keystore.location", None)
    if keystore is not None:
        settings.setdefault("ssl.certificate.location", keystore)
        settings.setdefault("ssl.key.location", keystore)
    if settings.get("ssl.endpoint.identification.algorithm") == "":
        settings["ssl.endpoint.identification.algorithm"] = "none"
    return settings


def load_client_properties(path: Path) -> dict[str, str]:
    """The librdkafka settings of a properties file, checked by librdkafka itself (an unknown
    key, or a certificate file it cannot read, is a ClientPropertiesError)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ClientPropertiesError(f"cannot read {path}: {e.strerror or e}") from None
    settings = librdkafka_settings(parse_properties(text, str(path)), str(path))
    check_settings(settings, str(path))
    return settings


def check_settings(settings: Mapping[str, str], source: str) -> None:
    """Let librdkafka refuse what it does not take, before any tool starts its work: making a
    client checks every setting and opens the certificate files, without connecting yet."""
    try:
        AdminClient({**settings, "bootstrap.servers": "127.0.0.1:9", "logger": QUIET})
    except KafkaException as e:
        reason = e.args[0].str() if e.args else str(e)
        raise ClientPropertiesError(f"{source}: {_without_values(reason, settings)}") from None


def _without_values(reason: str, settings: Mapping[str, str]) -> str:
    for key, value in settings.items():
        if ("password" in key or "secret" in key) and value and value in reason:
            reason = reason.replace(value, "***")
    return reason
