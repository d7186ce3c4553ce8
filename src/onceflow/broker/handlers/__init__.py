"""API handlers, one module per family; importing this package registers them all."""

from onceflow.broker.handlers import (  # noqa: F401
    acls,
    alter_configs,
    api_versions,
    configs,
    coordinator_lookup,
    fetch,
    groups,
    list_offsets,
    metadata,
    offsets,
    produce,
    sasl,
    scram_credentials,
    topics_admin,
    transactions,
    txn_markers,
)
