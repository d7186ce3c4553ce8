"""The cluster's finalized features as ApiVersions (v3+) advertises them (KIP-584).

onceflow has one feature, Kafka's ``transaction.version`` (KIP-890 part 2): level 2 makes
clients that know it use transactions version 2 (EndTxn v5 with the epoch bump at every end,
partitions added by the partition leader on Produce v12, TxnOffsetCommit v5 without
AddOffsetsToTxn). Kafka finalizes it with ``kafka-features``; a single node has no controller,
so it is the broker setting ``transaction.version`` (0, 1 or 2; new Kafka 4 clusters use 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from onceflow.protocol.api_key import ApiKey

TRANSACTION_VERSION = "transaction.version"
# The levels this broker supports (Kafka 4's TransactionVersion: TV_0, TV_1, TV_2).
SUPPORTED_TRANSACTION_VERSIONS = (0, 2)
# The first level whose clients bump the epoch at every EndTxn (TransactionVersion.TV_2).
EPOCH_BUMP_TRANSACTION_VERSION = 2

# The versions a transactions-version-2 client needs, which a broker below level 2 does not
# advertise, so that it answers exactly as before the feature existed.
_TV2_ONLY_VERSIONS = {ApiKey.END_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 5}


@dataclass(frozen=True)
class FinalizedFeatures:
    """The finalized level of each feature, and the epoch of that set: clients keep the
    features of the highest epoch they were told (NetworkClient), so it must grow whenever
    the set may have changed; the broker's start time does (Kafka: the metadata log offset)."""

    transaction_version: int = 0
    epoch: int = -1

    def levels(self) -> dict[str, int]:
        """Finalized features by name; Kafka leaves out a feature finalized at level 0."""
        if self.transaction_version <= 0:
            return {}
        return {TRANSACTION_VERSION: self.transaction_version}

    @property
    def transactions_v2(self) -> bool:
        return self.transaction_version >= EPOCH_BUMP_TRANSACTION_VERSION


NO_FEATURES = FinalizedFeatures()


class AdvertisedApis(dict[int, tuple[int, int]]):
    """The versions of each API the broker advertises, with the features it finalized."""

    features: FinalizedFeatures = NO_FEATURES


def advertised_apis(
    implemented: dict[int, tuple[int, int]], features: FinalizedFeatures
) -> AdvertisedApis:
    """`implemented` as advertised under `features`: below transaction.version 2 the versions
    only a version 2 client sends are left out."""
    apis = AdvertisedApis(implemented)
    apis.features = features
    if not features.transactions_v2:
        for key, first in _TV2_ONLY_VERSIONS.items():
            low, high = apis[key]
            apis[key] = (low, min(high, first - 1))
    return apis
