"""Objects Spark pickles make their Kafka clients on first use and never carry one in a pickle."""

from __future__ import annotations

import pickle

from onceflow.lazy_clients import HoldsClients, client_property
from onceflow.spark.options import SourceOptions
from onceflow.spark.topic_offsets import TopicOffsets


class FakeClient:
    made = 0

    def __init__(self) -> None:
        FakeClient.made += 1
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Holder(HoldsClients):
    def __init__(self, name: str) -> None:
        self.name = name

    @client_property
    def client(self) -> FakeClient:
        return FakeClient()


def test_a_client_is_made_once_on_first_use_and_left_out_of_a_pickle() -> None:
    holder = Holder("h")
    before = FakeClient.made
    assert pickle.loads(pickle.dumps(holder)).name == "h"  # nothing made to pickle it
    first = holder.client
    assert holder.client is first and FakeClient.made == before + 1
    copy = pickle.loads(pickle.dumps(holder))
    assert "client" not in copy.__dict__ and copy.name == "h"
    assert copy.client is not first  # the copy makes its own


def test_close_clients_closes_the_made_ones_and_the_next_use_makes_another() -> None:
    holder = Holder("h")
    holder.close_clients()  # none made: nothing to close
    first = holder.client
    holder.close_clients()
    assert first.closed
    assert holder.client is not first and not holder.client.closed


def test_the_source_lookup_pickles_without_its_admin_client() -> None:
    options = SourceOptions.parse(
        {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}, streaming=True
    )
    lookup = TopicOffsets(options)
    assert lookup.admin is lookup.admin  # made (no connection yet: librdkafka connects lazily)
    copy = pickle.loads(pickle.dumps(lookup))
    assert "admin" not in copy.__dict__ and copy.options == options
