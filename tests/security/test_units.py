"""The sans-IO pieces: listener parsing, the certificate principal, SCRAM (RFC 7677's vector),
the credential store and Kafka's rules for altering and describing credentials."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from onceflow.broker.config import BrokerConfig, ConfigError
from onceflow.security import scram as scram_module
from onceflow.security.credential_changes import Deletion, Upsertion, describe, plan_alteration
from onceflow.security.credentials import CredentialStore
from onceflow.security.listeners import (
    ListenerError,
    SecurityProtocol,
    advertised_endpoints,
    parse_listeners,
    parse_protocol_map,
)
from onceflow.security.principal import ANONYMOUS, certificate_principal, distinguished_name
from onceflow.security.scram import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    ScramError,
    ScramServer,
    credential_from_salted,
    new_credential,
    password_matches,
    salted_password,
)

MAP = parse_protocol_map(BrokerConfig().listener_security_protocol_map)


def test_listeners_parse_as_kafka_names_them() -> None:
    listeners = parse_listeners("PLAINTEXT://127.0.0.1:9092, sasl_ssl://:9094,SSL://[::1]:0", MAP)
    assert [(x.name, x.protocol, x.host, x.port) for x in listeners] == [
        ("PLAINTEXT", SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),
        ("SASL_SSL", SecurityProtocol.SASL_SSL, "", 9094),
        ("SSL", SecurityProtocol.SSL, "::1", 0),
    ]
    custom = parse_protocol_map("INTERNAL:SASL_SSL")
    assert parse_listeners("INTERNAL://h:1", custom)[0].protocol is SecurityProtocol.SASL_SSL


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("PLAINTEXT://h:1,PLAINTEXT://h:2", "distinct name"),
        ("PLAINTEXT://h:1,SSL://h:1", "distinct port"),
        ("FOO://h:1", "no security protocol"),
        ("PLAINTEXT:/h:1", "not LISTENER_NAME://HOST:PORT"),
        ("PLAINTEXT://h:70000", r"not in \[0, 65535\]"),
        ("", "no listener"),
    ],
)
def test_bad_listeners_are_refused_with_the_reason(value: str, message: str) -> None:
    with pytest.raises(ListenerError, match=message):
        parse_listeners(value, MAP)


def test_advertised_listeners_override_per_name_and_refuse_the_meta_address() -> None:
    listeners = parse_listeners("PLAINTEXT://0.0.0.0:9092,SSL://0.0.0.0:9093", MAP)
    advertised = parse_listeners("SSL://broker.example:19093", MAP, "advertised.listeners")
    assert advertised_endpoints(listeners, advertised, "host.example") == {
        "PLAINTEXT": ("host.example", 0),
        "SSL": ("broker.example", 19093),
    }
    with pytest.raises(ListenerError, match="nonroutable"):
        advertised_endpoints(
            listeners, parse_listeners("SSL://0.0.0.0:1", MAP, "advertised.listeners"), None
        )
    with pytest.raises(ListenerError, match="not one of the listeners"):
        advertised_endpoints(
            listeners, parse_listeners("SASL_SSL://h:1", MAP, "advertised.listeners"), None
        )


def test_config_checks_security_settings_at_load() -> None:
    config = BrokerConfig().with_settings({"listeners": "SSL://127.0.0.1:0"})
    assert config.listener_list()[0].protocol is SecurityProtocol.SSL
    assert BrokerConfig(host="h", port=5).listener_list()[0].url() == "PLAINTEXT://h:5"
    with pytest.raises(ConfigError, match="GSSAPI"):
        BrokerConfig().with_settings({"sasl.enabled.mechanisms": "GSSAPI,PLAIN"})
    with pytest.raises(ConfigError, match="distinct name"):
        BrokerConfig().with_settings({"listeners": "SSL://h:1,SSL://h:2"})
    secret = BrokerConfig().with_settings({"ssl.key.password": "hunter2"})
    assert "hunter2" not in secret.kafka_settings().values()
    assert "ssl.key.password" not in secret.kafka_settings()


def test_certificate_subject_prints_as_javas_rfc2253() -> None:
    subject = (
        (("countryName", "US"),),
        (("organizationName", "Acme, Inc"),),
        (("organizationalUnitName", "eng"), ("commonName", "alice")),
        (("emailAddress", "a@x.io"),),
    )
    assert distinguished_name(subject) == (
        "1.2.840.113549.1.9.1=#1606614078 2e696f".replace(" ", "")
        + ",OU=eng+CN=alice,O=Acme\\, Inc,C=US"
    )
    assert distinguished_name(((("commonName", " x "),),)) == "CN=\\ x\\ "
    assert distinguished_name(((("commonName", "#x;y"),),)) == "CN=\\#x\\;y"
    assert certificate_principal(None) is ANONYMOUS
    assert str(certificate_principal({"subject": ((("commonName", "bob"),),)})) == "User:CN=bob"


def _rfc7677_server(monkeypatch: pytest.MonkeyPatch) -> ScramServer:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = credential_from_salted(
        SCRAM_SHA_256, salted_password(SCRAM_SHA_256, "pencil", salt, 4096), salt, 4096
    )
    monkeypatch.setattr(
        scram_module.secrets, "token_urlsafe", lambda n: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    return ScramServer(SCRAM_SHA_256, lambda user: credential if user == "user" else None)


def test_scram_sha_256_follows_the_rfc_7677_example(monkeypatch: pytest.MonkeyPatch) -> None:
    server = _rfc7677_server(monkeypatch)
    first = server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    final = server.evaluate(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.username == "user"


@pytest.mark.parametrize(
    "final",
    [
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=AHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",  # wrong proof
        b"c=biws,r=someone-elses-nonce,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",  # channel binding changed
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",  # no proof
    ],
)
def test_scram_refuses_a_bad_final_message(monkeypatch: pytest.MonkeyPatch, final: bytes) -> None:
    server = _rfc7677_server(monkeypatch)
    server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(ScramError):
        server.evaluate(final)
    assert not server.complete


@pytest.mark.parametrize(
    "first",
    [
        b"n,,n=nobody,r=abc",  # unknown user
        b"p=tls-unique,,n=user,r=abc",  # channel binding asked for
        b"n,,n=us=3Xer,r=abc",  # bad escape
        b"n,,m=ext,n=user,r=abc",  # mandatory extension
        b"n,,n=user,r=abc,tokenauth=true",  # delegation token
        b"\xff",
    ],
)
def test_scram_refuses_a_bad_first_message(monkeypatch: pytest.MonkeyPatch, first: bytes) -> None:
    with pytest.raises(ScramError):
        _rfc7677_server(monkeypatch).evaluate(first)


def test_plain_passwords_check_against_the_scram_keys() -> None:
    credential = new_credential(SCRAM_SHA_512, "pw", 4096)
    assert password_matches(SCRAM_SHA_512, credential, "pw")
    assert not password_matches(SCRAM_SHA_512, credential, "pW")


def test_credential_store_round_trips_and_keeps_no_password(tmp_path: Path) -> None:
    store = CredentialStore.open(tmp_path)
    credential = new_credential(SCRAM_SHA_256, "the-password", 4096)
    table = store.changed({("alice", "SCRAM-SHA-256"): credential}, [])
    store.write(table)
    assert b"the-password" not in (tmp_path / "scram-credentials.json").read_bytes()
    assert (tmp_path / "scram-credentials.json").stat().st_mode & 0o077 == 0
    reopened = CredentialStore.open(tmp_path)
    assert reopened.get("alice", SCRAM_SHA_256) == credential
    assert reopened.get("alice", SCRAM_SHA_512) is None
    reopened.write(reopened.changed({}, [("alice", "SCRAM-SHA-256")]))
    assert CredentialStore.open(tmp_path).users() == []


def _upsertion(name: str, mechanism: int = 1, iterations: int = 4096) -> Upsertion:
    key_length = 32 if mechanism == 1 else 64
    return Upsertion(name, mechanism, iterations, b"salt", b"k" * key_length)


def test_alterations_follow_kafkas_rules(tmp_path: Path) -> None:
    store = CredentialStore(
        tmp_path, {"carol": {"SCRAM-SHA-256": new_credential(SCRAM_SHA_256, "x", 4096)}}
    )
    plan = plan_alteration(
        store,
        [Deletion("carol", 1), Deletion("dave", 1), Deletion("", 1)],
        [
            _upsertion("alice"),
            _upsertion("alice", 2),  # twice in one request
            _upsertion("bob", iterations=4095),
            _upsertion("erin", iterations=16385),
            _upsertion("frank", mechanism=9),
            _upsertion("carol", 2),  # deleted and upserted in one request
            _upsertion("grace", 2),
        ],
    )
    codes = {r.user: (r.error_code, r.error_message) for r in plan.results}
    assert codes == {
        "alice": (
            ErrorCode.duplicate_resource,
            "A user credential cannot be altered twice in the same request",
        ),
        "carol": (
            ErrorCode.duplicate_resource,
            "A user credential cannot be altered twice in the same request",
        ),
        "dave": (
            ErrorCode.resource_not_found,
            "Attempt to delete a user credential that does not exist",
        ),
        "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
        "bob": (ErrorCode.unacceptable_credential, "Too few iterations"),
        "erin": (ErrorCode.unacceptable_credential, "Too many iterations"),
        "frank": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "grace": (ErrorCode.none, None),
    }
    assert list(plan.upsertions) == [("grace", "SCRAM-SHA-512")] and plan.deletions == []


def test_describe_lists_everyone_or_the_users_asked_for(tmp_path: Path) -> None:
    store = CredentialStore(
        tmp_path,
        {
            "bob": {"SCRAM-SHA-512": new_credential(SCRAM_SHA_512, "x", 5000)},
            "alice": {"SCRAM-SHA-256": new_credential(SCRAM_SHA_256, "x", 4096)},
        },
    )
    assert [(r.user, r.credentials) for r in describe(store, None)] == [
        ("alice", ((1, 4096),)),
        ("bob", ((2, 5000),)),
    ]
    results = {r.user: r.error_code for r in describe(store, ["bob", "zed", "alice", "alice"])}
    assert results == {
        "bob": ErrorCode.none,
        "zed": ErrorCode.resource_not_found,
        "alice": ErrorCode.duplicate_resource,
    }
