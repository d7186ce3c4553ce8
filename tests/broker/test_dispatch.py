"""The handler table: written out explicitly, advertised as before. (That no module of the
broker imports the `Broker` back, through the table or otherwise, is tests/test_layers.py.)"""

from __future__ import annotations

from pathlib import Path

from kio.index import load_request_schema
from kio.schema.index import api_key_map

from onceflow.broker.dispatch import API_HANDLERS, parsed_versions, supported_versions
from onceflow.protocol.api_key import ApiKey

# What ApiVersions advertised when the table was filled by import side effects (decorators),
# SASL and the SCRAM credentials APIs included: the explicit table must advertise exactly the
# same keys and versions.
ADVERTISED_BEFORE = {
    0: (0, 12),
    1: (4, 17),
    2: (1, 9),
    3: (0, 12),
    8: (2, 9),
    9: (1, 9),
    10: (0, 6),
    11: (0, 9),
    12: (0, 4),
    13: (0, 5),
    14: (0, 5),
    15: (0, 5),
    16: (0, 5),
    17: (0, 1),
    18: (0, 4),
    19: (2, 7),
    20: (1, 6),
    21: (0, 2),
    22: (0, 5),
    24: (0, 3),
    25: (0, 4),
    26: (0, 5),  # v5: transactions version 2 (advertised with transaction.version 2)
    27: (1, 2),  # v2: the markers' TransactionVersion
    28: (0, 5),  # v5: transactions version 2 (advertised with transaction.version 2)
    29: (1, 3),
    30: (1, 3),
    31: (1, 3),
    32: (1, 4),
    33: (0, 2),
    36: (0, 2),
    37: (0, 3),
    42: (0, 2),
    44: (0, 1),
    48: (0, 1),
    50: (0, 0),
    51: (0, 0),
    61: (0, 0),
    65: (0, 0),
    66: (0, 1),
    # KIP-848 consumer groups
    68: (0, 1),
    69: (0, 1),
}

HANDLER_MODULES = sorted(
    p.stem
    for p in (Path(__file__).parents[2] / "src/onceflow/broker/handlers").glob("*.py")
    if p.stem != "__init__"
)


def test_the_table_advertises_what_it_did_before() -> None:
    assert supported_versions() == ADVERTISED_BEFORE


def test_each_api_is_in_the_table_once() -> None:
    keys = [h.api_key for h in API_HANDLERS]
    assert len(keys) == len(set(keys))


def test_kio_reads_every_version_the_broker_parses() -> None:
    for api_key, version in parsed_versions():
        load_request_schema(api_key, version)


def test_api_keys_are_named_as_kafka_names_them() -> None:
    # kio's schema names are Kafka's message names, whose upper-case is Kafka's ApiKeys name.
    assert {k.value: k.name for k in ApiKey} == {k: v.upper() for k, v in api_key_map.items()}
