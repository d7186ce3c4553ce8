"""A small blocking Kafka protocol client on `kio` entities, for tools.

confluent-kafka's AdminClient has no call for some admin APIs the tools need
(DescribeTransactions, ListTransactions, DescribeProducers, WriteTxnMarkers), so the tools speak
the protocol themselves, here. A `BrokerConnection` is one socket to one broker: it negotiates
versions with ApiVersions (the highest version both kio and the broker know), sends a request
entity and returns the typed response entity. A `KafkaClient` routes requests the way Kafka's
admin client does, so the same tool works against a multi-broker Apache Kafka cluster: Metadata
for partition leaders and the broker list, FindCoordinator for a transactional id's coordinator.

Failures are typed (`BrokerConnectionError`, `RequestTimeoutError`, `UnsupportedApiError`,
`KafkaResponseError`, `MalformedResponseError`), each with one readable line of text.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import ssl
import struct
import time
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.primitive import i64

from onceflow.protocol.api_key import ApiKey
from onceflow.protocol.bounds import skip_tagged_fields
from onceflow.protocol.client_security import AuthenticationError, ClientSecurity
from onceflow.protocol.entities import build, sibling
from onceflow.protocol.errors import ProtocolError

GROUP_KEY = 0
TRANSACTION_KEY = 1

CLIENT_SOFTWARE_NAME = "onceflow-protocol-client"
CLIENT_SOFTWARE_VERSION = "1.0"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_REQUEST_TIMEOUT_S = 15.0
# A response larger than this is not a response to anything a tool asks.
MAX_RESPONSE_BYTES = 100 * 1024 * 1024
RETRY_BACKOFF_S = 0.1

# Errors after which a request is sent again once the route (leader, coordinator) is refreshed.
RETRIABLE_ROUTE_ERRORS = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.leader_not_available,
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
    }
)

PLAINTEXT = ClientSecurity()
_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhih")
_ERROR_CODE = struct.Struct(">h")


class KafkaClientError(Exception):
    """Base class of the client's errors."""


class BrokerConnectionError(KafkaClientError):
    """No connection to a broker: refused, unresolvable, timed out, or closed mid-request.
    `reason` is the cause alone (e.g. "Connection refused"), for callers that name the
    address themselves."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


class RequestTimeoutError(KafkaClientError):
    """The broker accepted the request but sent no complete answer in time."""


class UnsupportedApiError(KafkaClientError):
    """The broker (or kio) does not know the API, or no version both sides support."""


class MalformedResponseError(KafkaClientError):
    """A response that does not parse as its schema says (or answers another request)."""


class KafkaResponseError(KafkaClientError):
    """A response carried a Kafka error code where the caller needed success."""

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


def error_name(code: ErrorCode | int) -> str:
    """Kafka's name for an error code, e.g. TRANSACTIONAL_ID_NOT_FOUND."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_ERROR_CODE_{int(code)}"


@cache
def kio_versions(api_key: int) -> tuple[int, int]:
    """The request versions kio has entities for (this client's side of the negotiation)."""
    try:
        versions = schema_name_map[api_key_map[api_key]]
    except KeyError:
        raise UnsupportedApiError(f"kio has no entities for API {api_key}") from None
    return min(versions), max(versions)


@cache
def response_class(api_key: int, version: int) -> type:
    """kio's response class, except that a non-nullable timestamp field is read as int64
    milliseconds: Kafka sends -1 there for "none" (DescribeTransactions' start time of a
    transactional id without a transaction) and kio refuses negative timestamps."""
    return _int_timestamps(load_response_schema(api_key, version))


@cache
def _int_timestamps(cls: type) -> type:
    hints = typing.get_type_hints(cls)
    changed = False
    specs: list[tuple[str, Any, Any]] = []
    for f in dataclasses.fields(cls):
        tp, metadata = hints[f.name], dict(f.metadata)
        if metadata.get("kafka_type") == "datetime_i64" and not _is_optional(tp):
            tp, metadata["kafka_type"], changed = i64, "int64", True
        elif typing.get_origin(tp) is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            inner = typing.get_args(tp)[0]
            if _int_timestamps(inner) is not inner:
                tp, changed = tuple[_int_timestamps(inner), ...], True  # type: ignore[misc]
        elif dataclasses.is_dataclass(tp) and _int_timestamps(tp) is not tp:
            tp, changed = _int_timestamps(tp), True
        options: dict[str, Any] = {"metadata": metadata}
        if f.default is not dataclasses.MISSING:
            options["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            options["default_factory"] = f.default_factory
        specs.append((f.name, tp, dataclasses.field(**options)))
    if not changed:
        return cls
    class_vars = ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__")
    return dataclasses.make_dataclass(
        cls.__name__,
        specs,
        frozen=True,
        slots=True,
        kw_only=True,
        namespace={name: getattr(cls, name) for name in class_vars},
    )


def _is_optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (types.UnionType, typing.Union) and type(None) in (
        typing.get_args(tp)
    )


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[v6addr]:PORT`) to its parts."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


# --- one broker ---------------------------------------------------------------------------------


class BrokerConnection:
    """One blocking socket to one broker, with the API versions it advertised."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = CLIENT_SOFTWARE_NAME,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.security = security
        self.api_versions: dict[int, tuple[int, int]] = {}
        # The broker's finalized features by name (ApiVersions v3+, KIP-584): level.
        self.finalized_features: dict[str, int] = {}
        self._socket: socket.socket | None = None
        self._correlation_id = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def is_open(self) -> bool:
        return self._socket is not None

    @classmethod
    def connect(cls, host: str, port: int, **settings: Any) -> BrokerConnection:
        """Open the socket and negotiate API versions (`settings`: the constructor's)."""
        connection = cls(host, port, **settings)
        connection.open()
        return connection

    def open(self) -> None:
        try:
            self._socket = socket.create_connection(
                (self.host, self.port), timeout=self.connect_timeout_s
            )
        except TimeoutError:
            reason = f"no connection within {self.connect_timeout_s:g} s"
            raise BrokerConnectionError(f"{self.address}: {reason}", reason) from None
        except OSError as e:
            reason = e.strerror or str(e)
            raise BrokerConnectionError(
                f"cannot connect to {self.address}: {reason}", reason
            ) from None
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._socket = self.security.wrap(self._socket, self.host)
        except (OSError, ssl.SSLError) as e:
            self.close()
            reason = f"TLS handshake failed ({getattr(e, 'reason', None) or e})"
            raise BrokerConnectionError(f"{self.address}: {reason}", reason) from None
        try:
            self._negotiate()
            if self.security.uses_sasl:
                self._authenticate()
        except KafkaClientError:
            self.close()
            raise

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- versions -----------------------------------------------------------------------------

    def _negotiate(self) -> None:
        """ApiVersions at kio's newest version; a broker that does not know it answers v0 with
        UNSUPPORTED_VERSION and its own range (KIP-511), and the request is sent again."""
        version = kio_versions(ApiKey.API_VERSIONS)[1]
        for _ in range(2):
            response = self._send(self._api_versions_request(version))
            ranges = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            if response.error_code == ErrorCode.none:
                self.api_versions = ranges
                self.finalized_features = {
                    f.name: f.max_version_level for f in getattr(response, "finalized_features", ())
                }
                return
            if (
                response.error_code != ErrorCode.unsupported_version
                or ApiKey.API_VERSIONS not in ranges
            ):
                raise KafkaResponseError(
                    response.error_code,
                    f"ApiVersions to {self.address} failed: {error_name(response.error_code)}",
                )
            version = min(ranges[ApiKey.API_VERSIONS][1], kio_versions(ApiKey.API_VERSIONS)[1])
        raise UnsupportedApiError(f"{self.address} accepts no ApiVersions version this client has")

    def _authenticate(self) -> None:
        """SaslHandshake, then the mechanism's SaslAuthenticate round trips (KIP-152)."""
        handshake = self.send(
            build(self.request_class(ApiKey.SASL_HANDSHAKE), mechanism=self.security.mechanism)
        )
        if handshake.error_code != ErrorCode.none:
            raise KafkaResponseError(
                handshake.error_code,
                f"{self.address} does not offer SASL {self.security.mechanism} "
                f"(it offers {', '.join(handshake.mechanisms) or 'none'})",
            )
        authenticate = self.request_class(ApiKey.SASL_AUTHENTICATE)

        def exchange(token: bytes) -> bytes:
            response = self.send(build(authenticate, auth_bytes=token))
            if response.error_code != ErrorCode.none:
                raise KafkaResponseError(
                    response.error_code,
                    f"authentication as {self.security.username!r} at {self.address} failed"
                    f" ({response.error_message or error_name(response.error_code)})",
                )
            return bytes(response.auth_bytes)

        try:
            self.security.authenticate(exchange)
        except AuthenticationError as e:
            raise KafkaResponseError(
                ErrorCode.sasl_authentication_failed, f"authentication at {self.address}: {e}"
            ) from None

    @staticmethod
    def _api_versions_request(version: int) -> Any:
        return build(
            load_request_schema(ApiKey.API_VERSIONS, version),
            client_software_name=CLIENT_SOFTWARE_NAME,
            client_software_version=CLIENT_SOFTWARE_VERSION,
        )

    def version_for(
        self, api_key: int, min_version: int | None = None, max_version: int | None = None
    ) -> int:
        """The highest version of the API that the broker, kio and the caller all accept."""
        if api_key not in self.api_versions:
            raise UnsupportedApiError(
                f"the broker at {self.address} does not support {_api_name(api_key)} "
                f"(API {api_key})"
            )
        broker_low, broker_high = self.api_versions[api_key]
        kio_low, kio_high = kio_versions(api_key)
        client_low = max(kio_low, min_version if min_version is not None else kio_low)
        client_high = min(kio_high, max_version if max_version is not None else kio_high)
        low, high = max(broker_low, client_low), min(broker_high, client_high)
        if low > high:
            raise UnsupportedApiError(
                f"no version of {_api_name(api_key)} (API {api_key}) is supported by both "
                f"the broker at {self.address} (v{broker_low}-v{broker_high}) and this client "
                f"(v{client_low}-v{client_high})"
            )
        return high

    def request_class(
        self, api_key: int, min_version: int | None = None, max_version: int | None = None
    ) -> type:
        """The kio request entity class of the negotiated version (build the request with it)."""
        return load_request_schema(api_key, self.version_for(api_key, min_version, max_version))

    # -- requests -----------------------------------------------------------------------------

    def send(self, request: Any) -> Any:
        """Send a kio request entity; return the typed response entity of the same version."""
        api_key, version = int(request.__api_key__), int(request.__version__)
        low, high = self.api_versions.get(api_key, (0, -1))
        if not low <= version <= high:
            raise UnsupportedApiError(
                f"the broker at {self.address} does not support {_api_name(api_key)} "
                f"(API {api_key}) v{version}"
            )
        return self._send(request)

    def _send(self, request: Any) -> Any:
        if self._socket is None:
            raise BrokerConnectionError(f"the connection to {self.address} is closed")
        api_key, version = int(request.__api_key__), int(request.__version__)
        self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        correlation_id = self._correlation_id
        deadline = time.monotonic() + self.request_timeout_s
        try:
            self._socket.settimeout(self.request_timeout_s)
            self._socket.sendall(_frame(request, correlation_id, self.client_id))
            payload = self._read_frame(deadline, api_key)
        except TimeoutError:
            # The stream is out of step now: an answer may still come. Start afresh next time.
            self.close()
            raise RequestTimeoutError(
                f"no answer from {self.address} to {_api_name(api_key)} within "
                f"{self.request_timeout_s:g} s"
            ) from None
        except OSError as e:
            self.close()
            raise BrokerConnectionError(
                f"connection to {self.address} failed during {_api_name(api_key)}: "
                f"{e.strerror or e}"
            ) from None
        return self._parse(payload, api_key, version, correlation_id)

    def _read_frame(self, deadline: float, api_key: int) -> bytes:
        size = _SIZE.unpack(self._read_exactly(4, deadline, api_key))[0]
        if not 4 <= size <= MAX_RESPONSE_BYTES:
            self.close()
            raise MalformedResponseError(
                f"{self.address} answered {_api_name(api_key)} with a frame of {size} bytes"
            )
        return self._read_exactly(size, deadline, api_key)

    def _read_exactly(self, size: int, deadline: float, api_key: int) -> bytes:
        assert self._socket is not None
        chunks: list[bytes] = []
        left = size
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._socket.settimeout(remaining)
            chunk = self._socket.recv(min(left, 1 << 20))
            if not chunk:
                self.close()
                raise BrokerConnectionError(
                    f"{self.address} closed the connection during {_api_name(api_key)}"
                )
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _parse(self, payload: bytes, api_key: int, version: int, correlation_id: int) -> Any:
        (answered,) = _SIZE.unpack_from(payload, 0)
        if answered != correlation_id:
            self.close()
            raise MalformedResponseError(
                f"{self.address} answered correlation id {answered}, expected {correlation_id}"
            )
        pos = 4
        try:
            if api_key == ApiKey.API_VERSIONS:
                # Header v0 always; an UNSUPPORTED_VERSION answer has a v0 body (KIP-511).
                (error,) = _ERROR_CODE.unpack_from(payload, pos)
                if error == ErrorCode.unsupported_version:
                    version = 0
            cls = response_class(api_key, version)
            if cls.__flexible__ and api_key != ApiKey.API_VERSIONS:
                pos = skip_tagged_fields(payload, pos)
            body, _ = entity_reader(cls)(payload, pos)
        except (
            SerialError,
            ProtocolError,
            ValueError,
            TypeError,
            KeyError,
            struct.error,
            IndexError,
        ) as e:
            self.close()
            raise MalformedResponseError(
                f"{self.address} sent a {_api_name(api_key)} v{version} response that does not "
                f"parse: {e}"
            ) from None
        return body


def _frame(request: Any, correlation_id: int, client_id: str) -> bytes:
    """Size, request header (v1, or v2 with tagged fields for flexible versions), body."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    client = client_id.encode()
    buf.write(
        _HEADER.pack(
            int(request.__api_key__), int(request.__version__), correlation_id, len(client)
        )
    )
    buf.write(client)
    if type(request).__flexible__:
        buf.write(b"\x00")
    entity_writer(type(request))(buf, request)
    out = buf.getbuffer()
    _SIZE.pack_into(out, 0, len(out) - 4)
    return bytes(out)


def _api_name(api_key: int) -> str:
    name = api_key_map.get(api_key)
    return "".join(part.capitalize() for part in name.split("_")) if name else f"API {api_key}"


# --- a cluster ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerNode:
    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class EachBroker:
    """Answers of every broker to one request, and the brokers that did not answer."""

    responses: list[tuple[BrokerNode, Any]] = field(default_factory=list)
    failures: list[tuple[BrokerNode, KafkaClientError]] = field(default_factory=list)


class KafkaClient:
    """Routes requests to the right broker of a cluster: partition leaders from Metadata,
    transaction and group coordinators from FindCoordinator."""

    def __init__(
        self,
        bootstrap: str | Sequence[tuple[str, int]],
        *,
        client_id: str = CLIENT_SOFTWARE_NAME,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        if isinstance(bootstrap, str):
            self.bootstrap = [parse_address(a) for a in bootstrap.split(",") if a.strip()]
        else:
            self.bootstrap = list(bootstrap)
        if not self.bootstrap:
            raise ValueError("no bootstrap address given")
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.security = security
        self.brokers: dict[int, BrokerNode] = {}
        self._leaders: dict[tuple[str, int], int] = {}
        self._partitions: dict[str, list[int]] = {}
        self._coordinators: dict[tuple[int, str], BrokerNode] = {}
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._bootstrap_connection: BrokerConnection | None = None

    @property
    def bootstrap_text(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.bootstrap)

    def connect(self) -> KafkaClient:
        """Connect to the first bootstrap broker that answers, and load the cluster's brokers."""
        failures: list[tuple[str, str]] = []
        for host, port in self.bootstrap:
            try:
                self._bootstrap_connection = self._connection(host, port)
                break
            except BrokerConnectionError as e:
                failures.append((f"{host}:{port}", e.reason))
            except RequestTimeoutError as e:
                failures.append((f"{host}:{port}", str(e)))
        if self._bootstrap_connection is None:
            if len(failures) == 1:
                reason = failures[0][1]
            else:
                reason = "; ".join(f"{address}: {why}" for address, why in failures)
            raise BrokerConnectionError(
                f"cannot reach any bootstrap broker ({self.bootstrap_text}): {reason}", reason
            )
        try:
            self.metadata()
        except KafkaClientError:
            self.close()
            raise
        return self

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
        self._bootstrap_connection = None

    def __enter__(self) -> KafkaClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections --------------------------------------------------------------------------

    def _connection(self, host: str, port: int) -> BrokerConnection:
        """A live connection to host:port, opened (and negotiated) when needed."""
        existing = self._connections.get((host, port))
        if existing is not None and existing.is_open:
            return existing
        connection = BrokerConnection.connect(
            host,
            port,
            client_id=self.client_id,
            connect_timeout_s=self.connect_timeout_s,
            request_timeout_s=self.request_timeout_s,
            security=self.security,
        )
        self._connections[(host, port)] = connection
        return connection

    def any_connection(self) -> BrokerConnection:
        """A connection for requests any broker answers (Metadata)."""
        if self._bootstrap_connection is not None and self._bootstrap_connection.is_open:
            return self._bootstrap_connection
        for node in self.brokers.values():
            try:
                self._bootstrap_connection = self._connection(node.host, node.port)
                return self._bootstrap_connection
            except (BrokerConnectionError, RequestTimeoutError):
                continue
        self._bootstrap_connection = None
        self.connect()
        assert self._bootstrap_connection is not None
        return self._bootstrap_connection

    def node_connection(self, node_id: int) -> BrokerConnection:
        node = self.brokers.get(node_id)
        if node is None:
            self.metadata()
            node = self.brokers.get(node_id)
        if node is None:
            raise KafkaResponseError(
                ErrorCode.broker_not_available, f"broker {node_id} is not in the cluster metadata"
            )
        return self._connection(node.host, node.port)

    # -- metadata -----------------------------------------------------------------------------

    def metadata(self, topics: Sequence[str] | None = None) -> Any:
        """A Metadata response (every topic when `topics` is None); refreshes the broker list
        and the leaders of the topics it names. Never creates a topic."""
        connection = self.any_connection()
        cls = connection.request_class(ApiKey.METADATA, min_version=1)
        topic_cls = sibling(cls, "MetadataRequestTopic")
        request = build(
            cls,
            topics=None
            if topics is None
            else tuple(build(topic_cls, name=name, topic_id=None) for name in topics),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        response = connection.send(request)
        self.brokers = {b.node_id: BrokerNode(b.node_id, b.host, b.port) for b in response.brokers}
        for topic in response.topics:
            # Forget what was known of the topic: it may have been deleted or recreated since.
            self._partitions.pop(topic.name, None)
            for key in [k for k in self._leaders if k[0] == topic.name]:
                del self._leaders[key]
            if topic.error_code != ErrorCode.none or topic.name is None:
                continue
            self._partitions[topic.name] = sorted(p.partition_index for p in topic.partitions)
            for p in topic.partitions:
                self._leaders[(topic.name, p.partition_index)] = p.leader_id
        return response

    def topics(self, include_internal: bool = False) -> list[str]:
        """Names of every topic in the cluster, sorted."""
        response = self.metadata()
        return sorted(
            t.name
            for t in response.topics
            if t.error_code == ErrorCode.none
            and t.name is not None
            and (include_internal or not t.is_internal)
        )

    def partitions(self, topic: str) -> list[int]:
        """The topic's partition indexes; KafkaResponseError when it does not exist."""
        response = self.metadata([topic])
        for t in response.topics:
            if t.name == topic and t.error_code != ErrorCode.none:
                raise KafkaResponseError(
                    t.error_code, f"topic {topic!r}: {error_name(t.error_code)}"
                )
        return list(self._partitions.get(topic, []))

    def leader(self, topic: str, partition: int, refresh: bool = False) -> int:
        """Node id of the partition's leader."""
        if refresh or (topic, partition) not in self._leaders:
            self.partitions(topic)
        leader = self._leaders.get((topic, partition))
        if leader is None:
            raise KafkaResponseError(
                ErrorCode.unknown_topic_or_partition,
                f"partition {partition} of topic {topic!r} does not exist",
            )
        if leader < 0:
            raise KafkaResponseError(
                ErrorCode.leader_not_available, f"{topic}-{partition} has no leader right now"
            )
        return leader

    def leader_connection(
        self, topic: str, partition: int, refresh: bool = False
    ) -> BrokerConnection:
        return self.node_connection(self.leader(topic, partition, refresh))

    # -- coordinators -------------------------------------------------------------------------

    def find_coordinator(
        self, key: str, key_type: int = TRANSACTION_KEY, refresh: bool = False
    ) -> BrokerNode:
        """The broker coordinating a transactional id (or a group, with GROUP_KEY); retried
        while the coordinator is loading or not yet elected."""
        cached = self._coordinators.get((key_type, key))
        if cached is not None and not refresh:
            return cached
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            error, node = self._find_coordinator_once(key, key_type)
            if error == ErrorCode.none:
                self._coordinators[(key_type, key)] = node
                return node
            if error not in RETRIABLE_ROUTE_ERRORS or time.monotonic() >= deadline:
                kind = "transactional id" if key_type == TRANSACTION_KEY else "group"
                raise KafkaResponseError(
                    error, f"no coordinator for {kind} {key!r}: {error_name(error)}"
                )
            time.sleep(RETRY_BACKOFF_S)

    def _find_coordinator_once(self, key: str, key_type: int) -> tuple[ErrorCode, BrokerNode]:
        connection = self.any_connection()
        # v0 has no key type: it finds group coordinators only.
        cls = connection.request_class(ApiKey.FIND_COORDINATOR, min_version=1 if key_type else 0)
        response = connection.send(build(cls, key=key, key_type=key_type, coordinator_keys=(key,)))
        answer = response.coordinators[0] if hasattr(response, "coordinators") else response
        return answer.error_code, BrokerNode(answer.node_id, answer.host, answer.port)

    def coordinator_connection(
        self, key: str, key_type: int = TRANSACTION_KEY, refresh: bool = False
    ) -> BrokerConnection:
        node = self.find_coordinator(key, key_type, refresh)
        return self._connection(node.host, node.port)

    # -- routed calls -------------------------------------------------------------------------

    def call(
        self,
        route: Callable[[bool], BrokerConnection],
        api_key: int,
        make: Callable[[type], Any],
        *,
        error_of: Callable[[Any], ErrorCode] | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
    ) -> Any:
        """Build a request for the negotiated version (`make(request_class)`), send it where
        `route(refresh)` says, and send it again, with a fresh route, while `error_of(response)`
        is a routing error (not leader, not coordinator, loading) and the deadline allows."""
        deadline = time.monotonic() + self.request_timeout_s
        refresh = False
        while True:
            connection = route(refresh)
            response = connection.send(
                make(connection.request_class(api_key, min_version, max_version))
            )
            error = error_of(response) if error_of is not None else ErrorCode.none
            if error not in RETRIABLE_ROUTE_ERRORS or time.monotonic() >= deadline:
                return response
            refresh = True
            time.sleep(RETRY_BACKOFF_S)

    def call_leader(
        self,
        topic: str,
        partition: int,
        api_key: int,
        make: Callable[[type], Any],
        **options: Any,
    ) -> Any:
        """A request for one partition, sent to its leader."""
        return self.call(
            lambda refresh: self.leader_connection(topic, partition, refresh),
            api_key,
            make,
            **options,
        )

    def call_coordinator(
        self,
        key: str,
        api_key: int,
        make: Callable[[type], Any],
        *,
        key_type: int = TRANSACTION_KEY,
        **options: Any,
    ) -> Any:
        """A request for a transactional id (or group), sent to its coordinator."""
        return self.call(
            lambda refresh: self.coordinator_connection(key, key_type, refresh),
            api_key,
            make,
            **options,
        )

    def call_each_broker(
        self, api_key: int, make: Callable[[type], Any], **options: Any
    ) -> EachBroker:
        """The same request to every broker of the cluster (e.g. ListTransactions, which each
        coordinator answers for its own transactional ids). A broker that cannot be reached is
        reported in `failures`, so the caller can say which answers are missing."""
        self.metadata()
        result = EachBroker()
        for node in sorted(self.brokers.values(), key=lambda n: n.node_id):
            try:
                connection = self._connection(node.host, node.port)
                response = self.call(_fixed_route(connection), api_key, make, **options)
            except (BrokerConnectionError, RequestTimeoutError, MalformedResponseError) as e:
                result.failures.append((node, e))
                continue
            result.responses.append((node, response))
        return result

    def leaders_of(self, partitions: Sequence[tuple[str, int]]) -> dict[int, list[tuple[str, int]]]:
        """Partitions grouped by the node id of their leader."""
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for topic, partition in partitions:
            by_leader.setdefault(self.leader(topic, partition), []).append((topic, partition))
        return by_leader


def _fixed_route(connection: BrokerConnection) -> Callable[[bool], BrokerConnection]:
    """A route that always leads to the same broker (nothing to refresh)."""
    return lambda _refresh: connection
