"""Declarations of the Kafka messages Partita knows, in a small declarative form.

Owns: the field layout of every request, response and header Partita decodes or
encodes on its Kafka port: each field's name, type, the versions it exists in,
the versions it may be null in, whether it is a tagged field (and its tag), and
its default. ``server.kafka.codec`` turns these declarations into encoders,
decoders and message classes at import; nothing here encodes a byte.

Must not know: sockets, framing, what a broker does with a message, which
versions the broker chooses to serve (that is the Kafka front-end's
ApiVersions table, a subset of what is declared here).

The form follows Kafka's own message definitions (the JSON files under
``clients/src/main/resources/common/message`` that Kafka generates its
``*Data`` classes from), written as Python calls:

    f("topics", array("MetadataRequestTopic",
        f("topic_id", UUID, "10+"),
        f("name", STRING, nullable="10+"),
    ), nullable="1+")

- A version range is ``"3+"`` (3 and up), ``"0-12"``, ``"5"`` or ``"none"``.
  A field's range is intersected with its message's valid versions.
- ``flexible`` versions of a message (Kafka's KIP-482) encode strings, bytes,
  arrays and records compactly (unsigned-varint length + 1, 0 for null) and end
  every struct with a tagged-field section.
- A tagged field (``tag=N``) is written in that section, and only when it
  differs from its default; it is optional for the reader.
- Field names are Kafka's, in snake_case (``TransactionalId`` →
  ``transactional_id``), the same rule kafka-python uses.
- Defaults follow Kafka's: 0, false, "" (or None where the JSON says null), an
  empty array, a struct of defaults; ``default=`` overrides.

Version ranges chosen: each API's range is what a Kafka 4.x broker accepts
(its message definitions' ``validVersions``; Kafka 4.0 dropped the pre-0.11
versions, KIP-896), except ApiVersions, declared 0-3: v4 differs from v3 only
in what SupportedFeatures' minimum may be, and a client that asks for v4 gets
the UNSUPPORTED_VERSION answer at v0 and retries at 3, as every client does
against an older broker. The clients exercised here use versions inside
these ranges: librdkafka (confluent-kafka 2.x, kcat) and kafka-python pick the
highest version both sides support; aiokafka 0.14 tops out at Produce 7,
Fetch 11, Metadata 5, ListOffsets 3 (docs/kafka.md has the table).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
import uuid as _uuid
from collections.abc import Iterable

# --------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------

VERSION_MAX = 0x7FFF  # an open-ended range ("3+") runs to the int16 maximum


@dataclasses.dataclass(frozen=True)
class Versions:
    """An inclusive range of versions; ``lo > hi`` is the empty range."""

    lo: int
    hi: int

    def __contains__(self, version: int) -> bool:
        return self.lo <= version <= self.hi

    @property
    def empty(self) -> bool:
        return self.lo > self.hi

    def intersect(self, other: Versions) -> Versions:
        return Versions(max(self.lo, other.lo), min(self.hi, other.hi))

    def __iter__(self):
        return iter(range(self.lo, self.hi + 1))

    def __str__(self) -> str:
        if self.empty:
            return "none"
        if self.hi == VERSION_MAX:
            return f"{self.lo}+"
        return f"{self.lo}" if self.lo == self.hi else f"{self.lo}-{self.hi}"


NO_VERSIONS = Versions(1, 0)
ALL_VERSIONS = Versions(0, VERSION_MAX)
_RANGE = re.compile(r"^(\d+)(?:(\+)|-(\d+))?$")


def versions(spec: str | Versions) -> Versions:
    """Parse ``"3+"``, ``"0-12"``, ``"5"`` or ``"none"``."""
    if isinstance(spec, Versions):
        return spec
    if spec == "none":
        return NO_VERSIONS
    m = _RANGE.match(spec)
    if m is None:
        raise ValueError(f"bad version range {spec!r}")
    lo = int(m.group(1))
    if m.group(2):
        return Versions(lo, VERSION_MAX)
    hi = int(m.group(3)) if m.group(3) is not None else lo
    if hi < lo:
        raise ValueError(f"bad version range {spec!r}")
    return Versions(lo, hi)


# --------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Primitive:
    """A scalar wire type: fixed width (``size``) or length-prefixed (``size`` None)."""

    name: str
    size: int | None
    struct_code: str | None = None  # struct-module code of a fixed-width type


BOOL = Primitive("bool", 1, "?")
INT8 = Primitive("int8", 1, "b")
INT16 = Primitive("int16", 2, "h")
UINT16 = Primitive("uint16", 2, "H")
INT32 = Primitive("int32", 4, "i")
UINT32 = Primitive("uint32", 4, "I")
INT64 = Primitive("int64", 8, "q")
FLOAT64 = Primitive("float64", 8, "d")
UUID = Primitive("uuid", 16)
STRING = Primitive("string", None)
BYTES = Primitive("bytes", None)
RECORDS = Primitive("records", None)  # record batches, kept as raw bytes (server.kafka.records)

PRIMITIVES = (BOOL, INT8, INT16, UINT16, INT32, UINT32, INT64, FLOAT64, UUID, STRING, BYTES, RECORDS)


@dataclasses.dataclass(frozen=True)
class Struct:
    """A named group of fields: a message body, an array element or a struct-typed field."""

    name: str
    fields: tuple[Field, ...]


@dataclasses.dataclass(frozen=True)
class Array:
    """An array of a primitive type or of a struct."""

    item: Primitive | Struct


FieldType = Primitive | Struct | Array

_UNSET = object()


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    type: FieldType
    versions: Versions
    nullable: Versions = NO_VERSIONS
    tag: int | None = None
    tagged: Versions = NO_VERSIONS
    default: object = _UNSET
    # Versions in which this field uses the compact encodings; None = the
    # message's flexible versions. Only the request header's client_id sets
    # it ("none": it stays a plain int16-length string even in header v2, so
    # a broker can read it without knowing the API's flexible versions).
    flexible: Versions | None = None

    def present_in(self, version: int) -> bool:
        return version in self.versions

    def is_tagged_in(self, version: int) -> bool:
        return self.tag is not None and version in self.tagged

    def default_value(self):
        """The value this field takes when absent (a fresh object for arrays and structs)."""
        if self.default is not _UNSET:
            return self.default
        return type_default(self.type)


def type_default(t: FieldType):
    if isinstance(t, Array):
        return []
    if isinstance(t, Struct):
        return None  # the codec substitutes an instance of defaults
    return _PRIMITIVE_DEFAULTS[t.name]


_PRIMITIVE_DEFAULTS = {
    "bool": False, "int8": 0, "int16": 0, "uint16": 0, "int32": 0, "uint32": 0,
    "int64": 0, "float64": 0.0, "uuid": _uuid.UUID(int=0), "string": "", "bytes": b"", "records": None,
}


@dataclasses.dataclass(frozen=True)
class Message:
    """A request, response or header: a top-level struct with versions."""

    name: str
    kind: str  # "request" | "response" | "header"
    api_key: int | None
    valid: Versions
    flexible: Versions
    body: Struct

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible


# --------------------------------------------------------------------------
# The declaration helpers
# --------------------------------------------------------------------------


def f(name: str, type_: FieldType, vers: str = "0+", *, nullable: str = "none",
      tag: int | None = None, tagged: str | None = None, default=_UNSET,
      flexible: str | None = None) -> Field:
    """Declare a field; ``tag`` makes it a tagged field in all its versions unless ``tagged`` says otherwise."""
    assert name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_"), name
    # A nullable struct (KIP-893: an int8 presence byte, -1 for null) defaults to null.
    assert not (isinstance(type_, Struct) and nullable != "none" and default is not None), \
        f"{name}: a nullable struct defaults to null"
    fv = versions(vers)
    tv = NO_VERSIONS
    if tag is not None:
        tv = versions(tagged) if tagged is not None else fv
    return Field(name, type_, fv, versions(nullable), tag, tv, default,
                 None if flexible is None else versions(flexible))


def array(item: str | Primitive, *fields: Field) -> Array:
    """``array(INT32)`` or ``array("StructName", f(...), ...)``."""
    if isinstance(item, Primitive):
        assert not fields
        return Array(item)
    return Array(Struct(item, tuple(fields)))


def struct(name: str, *fields: Field) -> Struct:
    return Struct(name, tuple(fields))


REQUESTS: dict[int, Message] = {}
RESPONSES: dict[int, Message] = {}
HEADERS: dict[str, Message] = {}


def define(kind: str, api_key: int | None, name: str, valid: str, flexible: str,
           fields: Iterable[Field]) -> Message:
    """A message from its fields (not registered: ``api`` and the headers below register theirs)."""
    valid_v = versions(valid)
    return Message(name, kind, api_key, valid_v, versions(flexible).intersect(valid_v),
                   _clip(Struct(name, tuple(fields)), valid_v))


def _register(msg: Message) -> Message:
    table = {"request": REQUESTS, "response": RESPONSES}.get(msg.kind)
    if table is None:
        HEADERS[msg.name] = msg
    else:
        assert msg.api_key not in table, msg.name
        table[msg.api_key] = msg
    return msg


def _clip(s: Struct, valid: Versions) -> Struct:
    """Intersect every field's version ranges with the message's valid versions."""
    out = []
    for fld in s.fields:
        t = fld.type
        if isinstance(t, Array) and isinstance(t.item, Struct):
            t = Array(_clip(t.item, valid))
        elif isinstance(t, Struct):
            t = _clip(t, valid)
        out.append(dataclasses.replace(
            fld, type=t, versions=fld.versions.intersect(valid),
            nullable=fld.nullable.intersect(valid), tagged=fld.tagged.intersect(valid)))
    return Struct(s.name, tuple(out))


def api(api_key: int, name: str, valid: str, flexible: str,
        request: Iterable[Field], response: Iterable[Field]) -> None:
    """Declare one API: its request and response share key, versions and flexible versions."""
    _register(define("request", api_key, name + "Request", valid, flexible, request))
    _register(define("response", api_key, name + "Response", valid, flexible, response))


# --------------------------------------------------------------------------
# Headers
# --------------------------------------------------------------------------

# Request header v0 (api key, version, correlation id) is only used by
# ControlledShutdown v0, which no client sends to a KRaft-era broker; v1 adds
# the client id, v2 (for flexible request versions) adds tagged fields.
REQUEST_HEADER = _register(define("header", None, "RequestHeader", "0-2", "2+", [
    f("request_api_key", INT16),
    f("request_api_version", INT16),
    f("correlation_id", INT32),
    f("client_id", STRING, "1+", nullable="1+", default=None, flexible="none"),
]))
# Response header v1 (for flexible response versions) adds tagged fields.
RESPONSE_HEADER = _register(define("header", None, "ResponseHeader", "0-1", "1+", [
    f("correlation_id", INT32),
]))

# --------------------------------------------------------------------------
# APIs (keys as in Kafka's ApiKeys)
# --------------------------------------------------------------------------

_NODE_ENDPOINT = ("NodeEndpoint", (
    f("node_id", INT32),
    f("host", STRING),
    f("port", INT32),
    f("rack", STRING, nullable="0+", default=None),
))


def _node_endpoints(vers: str) -> Field:
    name, fields = _NODE_ENDPOINT
    return f("node_endpoints", array(name, *fields), vers, tag=0)


def _leader_id_and_epoch(vers: str, tag: int) -> Field:
    return f("current_leader", struct("LeaderIdAndEpoch",
        f("leader_id", INT32, default=-1),
        f("leader_epoch", INT32, default=-1),
    ), vers, tag=tag)


api(0, "Produce", "3-13", "9+", request=[
    f("transactional_id", STRING, "3+", nullable="3+", default=None),
    f("acks", INT16),
    f("timeout_ms", INT32),
    f("topic_data", array("TopicProduceData",
        f("name", STRING, "0-12"),
        f("topic_id", UUID, "13+"),
        f("partition_data", array("PartitionProduceData",
            f("index", INT32),
            f("records", RECORDS, nullable="0+"),
        )),
    )),
], response=[
    f("responses", array("TopicProduceResponse",
        f("name", STRING, "0-12"),
        f("topic_id", UUID, "13+"),
        f("partition_responses", array("PartitionProduceResponse",
            f("index", INT32),
            f("error_code", INT16),
            f("base_offset", INT64),
            f("log_append_time_ms", INT64, "2+", default=-1),
            f("log_start_offset", INT64, "5+", default=-1),
            f("record_errors", array("BatchIndexAndErrorMessage",
                f("batch_index", INT32),
                f("batch_index_error_message", STRING, nullable="0+", default=None),
            ), "8+"),
            f("error_message", STRING, "8+", nullable="8+", default=None),
            _leader_id_and_epoch("10+", tag=0),
        )),
    )),
    f("throttle_time_ms", INT32, "1+"),
    _node_endpoints("10+"),
])

api(1, "Fetch", "4-18", "12+", request=[
    f("cluster_id", STRING, "12+", nullable="12+", tag=0, default=None),
    f("replica_id", INT32, "0-14", default=-1),
    f("replica_state", struct("ReplicaState",
        f("replica_id", INT32, default=-1),
        f("replica_epoch", INT64, default=-1),
    ), "15+", tag=1),
    f("max_wait_ms", INT32),
    f("min_bytes", INT32),
    f("max_bytes", INT32, "3+", default=0x7FFFFFFF),
    f("isolation_level", INT8, "4+"),
    f("session_id", INT32, "7+"),
    f("session_epoch", INT32, "7+", default=-1),
    f("topics", array("FetchTopic",
        f("topic", STRING, "0-12"),
        f("topic_id", UUID, "13+"),
        f("partitions", array("FetchPartition",
            f("partition", INT32),
            f("current_leader_epoch", INT32, "9+", default=-1),
            f("fetch_offset", INT64),
            f("last_fetched_epoch", INT32, "12+", default=-1),
            f("log_start_offset", INT64, "5+", default=-1),
            f("partition_max_bytes", INT32),
            f("replica_directory_id", UUID, "17+", tag=0),
            f("high_watermark", INT64, "18+", tag=1, default=0x7FFFFFFFFFFFFFFF),
        )),
    )),
    f("forgotten_topics_data", array("ForgottenTopic",
        f("topic", STRING, "7-12"),
        f("topic_id", UUID, "13+"),
        f("partitions", array(INT32)),
    ), "7+"),
    f("rack_id", STRING, "11+"),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16, "7+"),
    f("session_id", INT32, "7+"),
    f("responses", array("FetchableTopicResponse",
        f("topic", STRING, "0-12"),
        f("topic_id", UUID, "13+"),
        f("partitions", array("PartitionData",
            f("partition_index", INT32),
            f("error_code", INT16),
            f("high_watermark", INT64),
            f("last_stable_offset", INT64, "4+", default=-1),
            f("log_start_offset", INT64, "5+", default=-1),
            f("diverging_epoch", struct("EpochEndOffset",
                f("epoch", INT32, default=-1),
                f("end_offset", INT64, default=-1),
            ), "12+", tag=0),
            _leader_id_and_epoch("12+", tag=1),
            f("snapshot_id", struct("SnapshotId",
                f("end_offset", INT64, default=-1),
                f("epoch", INT32, default=-1),
            ), "12+", tag=2),
            f("aborted_transactions", array("AbortedTransaction",
                f("producer_id", INT64),
                f("first_offset", INT64),
            ), "4+", nullable="4+"),
            f("preferred_read_replica", INT32, "11+", default=-1),
            f("records", RECORDS, nullable="0+"),
        )),
    )),
    _node_endpoints("16+"),
])

api(2, "ListOffsets", "1-11", "6+", request=[
    f("replica_id", INT32),
    f("isolation_level", INT8, "2+"),
    f("topics", array("ListOffsetsTopic",
        f("name", STRING),
        f("partitions", array("ListOffsetsPartition",
            f("partition_index", INT32),
            f("current_leader_epoch", INT32, "4+", default=-1),
            f("timestamp", INT64),
        )),
    )),
    f("timeout_ms", INT32, "10+"),
], response=[
    f("throttle_time_ms", INT32, "2+"),
    f("topics", array("ListOffsetsTopicResponse",
        f("name", STRING),
        f("partitions", array("ListOffsetsPartitionResponse",
            f("partition_index", INT32),
            f("error_code", INT16),
            f("timestamp", INT64, "1+", default=-1),
            f("offset", INT64, "1+", default=-1),
            f("leader_epoch", INT32, "4+", default=-1),
        )),
    )),
])

api(3, "Metadata", "0-13", "9+", request=[
    f("topics", array("MetadataRequestTopic",
        f("topic_id", UUID, "10+"),
        f("name", STRING, nullable="10+"),
    ), nullable="1+"),
    f("allow_auto_topic_creation", BOOL, "4+", default=True),
    f("include_cluster_authorized_operations", BOOL, "8-10"),
    f("include_topic_authorized_operations", BOOL, "8+"),
], response=[
    f("throttle_time_ms", INT32, "3+"),
    f("brokers", array("MetadataResponseBroker",
        f("node_id", INT32),
        f("host", STRING),
        f("port", INT32),
        f("rack", STRING, "1+", nullable="1+", default=None),
    )),
    f("cluster_id", STRING, "2+", nullable="2+", default=None),
    f("controller_id", INT32, "1+", default=-1),
    f("topics", array("MetadataResponseTopic",
        f("error_code", INT16),
        f("name", STRING, nullable="12+"),
        f("topic_id", UUID, "10+"),
        f("is_internal", BOOL, "1+"),
        f("partitions", array("MetadataResponsePartition",
            f("error_code", INT16),
            f("partition_index", INT32),
            f("leader_id", INT32),
            f("leader_epoch", INT32, "7+", default=-1),
            f("replica_nodes", array(INT32)),
            f("isr_nodes", array(INT32)),
            f("offline_replicas", array(INT32), "5+"),
        )),
        f("topic_authorized_operations", INT32, "8+", default=-2147483648),
    )),
    f("cluster_authorized_operations", INT32, "8-10", default=-2147483648),
    f("error_code", INT16, "13+"),
])

api(8, "OffsetCommit", "2-10", "8+", request=[
    f("group_id", STRING),
    f("generation_id_or_member_epoch", INT32, "1+", default=-1),
    f("member_id", STRING, "1+"),
    f("group_instance_id", STRING, "7+", nullable="7+", default=None),
    f("retention_time_ms", INT64, "2-4", default=-1),
    f("topics", array("OffsetCommitRequestTopic",
        f("name", STRING, "0-9"),
        f("topic_id", UUID, "10+"),
        f("partitions", array("OffsetCommitRequestPartition",
            f("partition_index", INT32),
            f("committed_offset", INT64),
            f("committed_leader_epoch", INT32, "6+", default=-1),
            f("committed_metadata", STRING, nullable="0+"),
        )),
    )),
], response=[
    f("throttle_time_ms", INT32, "3+"),
    f("topics", array("OffsetCommitResponseTopic",
        f("name", STRING, "0-9"),
        f("topic_id", UUID, "10+"),
        f("partitions", array("OffsetCommitResponsePartition",
            f("partition_index", INT32),
            f("error_code", INT16),
        )),
    )),
])

api(9, "OffsetFetch", "1-10", "6+", request=[
    f("group_id", STRING, "0-7"),
    f("topics", array("OffsetFetchRequestTopic",
        f("name", STRING),
        f("partition_indexes", array(INT32)),
    ), "0-7", nullable="2-7"),
    f("groups", array("OffsetFetchRequestGroup",
        f("group_id", STRING),
        f("member_id", STRING, "9+", nullable="9+", default=None),
        f("member_epoch", INT32, "9+", default=-1),
        f("topics", array("OffsetFetchRequestTopics",
            f("name", STRING, "8-9"),
            f("topic_id", UUID, "10+"),
            f("partition_indexes", array(INT32)),
        ), nullable="8+"),
    ), "8+"),
    f("require_stable", BOOL, "7+"),
], response=[
    f("throttle_time_ms", INT32, "3+"),
    f("topics", array("OffsetFetchResponseTopic",
        f("name", STRING),
        f("partitions", array("OffsetFetchResponsePartition",
            f("partition_index", INT32),
            f("committed_offset", INT64),
            f("committed_leader_epoch", INT32, "5-7", default=-1),
            f("metadata", STRING, nullable="0-7"),
            f("error_code", INT16),
        )),
    ), "0-7"),
    f("error_code", INT16, "2-7"),
    f("groups", array("OffsetFetchResponseGroup",
        f("group_id", STRING),
        f("topics", array("OffsetFetchResponseTopics",
            f("name", STRING, "8-9"),
            f("topic_id", UUID, "10+"),
            f("partitions", array("OffsetFetchResponsePartitions",
                f("partition_index", INT32),
                f("committed_offset", INT64),
                f("committed_leader_epoch", INT32, default=-1),
                f("metadata", STRING, nullable="0+"),
                f("error_code", INT16),
            )),
        )),
        f("error_code", INT16),
    ), "8+"),
])

api(10, "FindCoordinator", "0-6", "3+", request=[
    f("key", STRING, "0-3"),
    f("key_type", INT8, "1+"),
    f("coordinator_keys", array(STRING), "4+"),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16, "0-3"),
    f("error_message", STRING, "1-3", nullable="1-3", default=None),
    f("node_id", INT32, "0-3"),
    f("host", STRING, "0-3"),
    f("port", INT32, "0-3"),
    f("coordinators", array("Coordinator",
        f("key", STRING),
        f("node_id", INT32),
        f("host", STRING),
        f("port", INT32),
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+", default=None),
    ), "4+"),
])

api(11, "JoinGroup", "0-9", "6+", request=[
    f("group_id", STRING),
    f("session_timeout_ms", INT32),
    f("rebalance_timeout_ms", INT32, "1+", default=-1),
    f("member_id", STRING),
    f("group_instance_id", STRING, "5+", nullable="5+", default=None),
    f("protocol_type", STRING),
    f("protocols", array("JoinGroupRequestProtocol",
        f("name", STRING),
        f("metadata", BYTES),
    )),
    f("reason", STRING, "8+", nullable="8+", default=None),
], response=[
    f("throttle_time_ms", INT32, "2+"),
    f("error_code", INT16),
    f("generation_id", INT32, default=-1),
    f("protocol_type", STRING, "7+", nullable="7+", default=None),
    f("protocol_name", STRING, nullable="7+"),
    f("leader", STRING),
    f("skip_assignment", BOOL, "9+"),
    f("member_id", STRING),
    f("members", array("JoinGroupResponseMember",
        f("member_id", STRING),
        f("group_instance_id", STRING, "5+", nullable="5+", default=None),
        f("metadata", BYTES),
    )),
])

api(12, "Heartbeat", "0-4", "4+", request=[
    f("group_id", STRING),
    f("generation_id", INT32),
    f("member_id", STRING),
    f("group_instance_id", STRING, "3+", nullable="3+", default=None),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16),
])

api(13, "LeaveGroup", "0-5", "4+", request=[
    f("group_id", STRING),
    f("member_id", STRING, "0-2"),
    f("members", array("MemberIdentity",
        f("member_id", STRING),
        f("group_instance_id", STRING, nullable="0+", default=None),
        f("reason", STRING, "5+", nullable="5+", default=None),
    ), "3+"),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16),
    f("members", array("MemberResponse",
        f("member_id", STRING),
        f("group_instance_id", STRING, nullable="0+"),
        f("error_code", INT16),
    ), "3+"),
])

api(14, "SyncGroup", "0-5", "4+", request=[
    f("group_id", STRING),
    f("generation_id", INT32),
    f("member_id", STRING),
    f("group_instance_id", STRING, "3+", nullable="3+", default=None),
    f("protocol_type", STRING, "5+", nullable="5+", default=None),
    f("protocol_name", STRING, "5+", nullable="5+", default=None),
    f("assignments", array("SyncGroupRequestAssignment",
        f("member_id", STRING),
        f("assignment", BYTES),
    )),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16),
    f("protocol_type", STRING, "5+", nullable="5+", default=None),
    f("protocol_name", STRING, "5+", nullable="5+", default=None),
    f("assignment", BYTES),
])

api(15, "DescribeGroups", "0-6", "5+", request=[
    f("groups", array(STRING)),
    f("include_authorized_operations", BOOL, "3+"),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("groups", array("DescribedGroup",
        f("error_code", INT16),
        f("error_message", STRING, "6+", nullable="6+", default=None),
        f("group_id", STRING),
        f("group_state", STRING),
        f("protocol_type", STRING),
        f("protocol_data", STRING),
        f("members", array("DescribedGroupMember",
            f("member_id", STRING),
            f("group_instance_id", STRING, "4+", nullable="4+", default=None),
            f("client_id", STRING),
            f("client_host", STRING),
            f("member_metadata", BYTES),
            f("member_assignment", BYTES),
        )),
        f("authorized_operations", INT32, "3+", default=-2147483648),
    )),
])

api(16, "ListGroups", "0-5", "3+", request=[
    f("states_filter", array(STRING), "4+"),
    f("types_filter", array(STRING), "5+"),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("error_code", INT16),
    f("groups", array("ListedGroup",
        f("group_id", STRING),
        f("protocol_type", STRING),
        f("group_state", STRING, "4+"),
        f("group_type", STRING, "5+"),
    )),
])

api(17, "SaslHandshake", "0-1", "none", request=[
    f("mechanism", STRING),
], response=[
    f("error_code", INT16),
    f("mechanisms", array(STRING)),
])

api(18, "ApiVersions", "0-3", "3+", request=[
    f("client_software_name", STRING, "3+"),
    f("client_software_version", STRING, "3+"),
], response=[
    f("error_code", INT16),
    f("api_keys", array("ApiVersion",
        f("api_key", INT16),
        f("min_version", INT16),
        f("max_version", INT16),
    )),
    f("throttle_time_ms", INT32, "1+"),
    f("supported_features", array("SupportedFeatureKey",
        f("name", STRING),
        f("min_version", INT16),
        f("max_version", INT16),
    ), "3+", tag=0),
    f("finalized_features_epoch", INT64, "3+", tag=1, default=-1),
    f("finalized_features", array("FinalizedFeatureKey",
        f("name", STRING),
        f("max_version_level", INT16),
        f("min_version_level", INT16),
    ), "3+", tag=2),
    f("zk_migration_ready", BOOL, "3+", tag=3),
])

api(19, "CreateTopics", "2-7", "5+", request=[
    f("topics", array("CreatableTopic",
        f("name", STRING),
        f("num_partitions", INT32),
        f("replication_factor", INT16),
        f("assignments", array("CreatableReplicaAssignment",
            f("partition_index", INT32),
            f("broker_ids", array(INT32)),
        )),
        f("configs", array("CreatableTopicConfig",
            f("name", STRING),
            f("value", STRING, nullable="0+"),
        )),
    )),
    f("timeout_ms", INT32, default=60000),
    f("validate_only", BOOL, "1+"),
], response=[
    f("throttle_time_ms", INT32, "2+"),
    f("topics", array("CreatableTopicResult",
        f("name", STRING),
        f("topic_id", UUID, "7+"),
        f("error_code", INT16),
        f("error_message", STRING, "1+", nullable="0+"),
        f("topic_config_error_code", INT16, "5+", tag=0),
        f("num_partitions", INT32, "5+", default=-1),
        f("replication_factor", INT16, "5+", default=-1),
        f("configs", array("CreatableTopicConfigs",
            f("name", STRING),
            f("value", STRING, nullable="0+"),
            f("read_only", BOOL),
            f("config_source", INT8, default=-1),
            f("is_sensitive", BOOL),
        ), "5+", nullable="5+"),
    )),
])

api(20, "DeleteTopics", "1-6", "4+", request=[
    f("topics", array("DeleteTopicState",
        f("name", STRING, nullable="0+", default=None),
        f("topic_id", UUID),
    ), "6+"),
    f("topic_names", array(STRING), "0-5"),
    f("timeout_ms", INT32),
], response=[
    f("throttle_time_ms", INT32, "1+"),
    f("responses", array("DeletableTopicResult",
        f("name", STRING, nullable="6+"),
        f("topic_id", UUID, "6+"),
        f("error_code", INT16),
        f("error_message", STRING, "5+", nullable="5+", default=None),
    )),
])

api(22, "InitProducerId", "0-6", "2+", request=[
    f("transactional_id", STRING, nullable="0+"),
    f("transaction_timeout_ms", INT32),
    f("producer_id", INT64, "3+", default=-1),
    f("producer_epoch", INT16, "3+", default=-1),
    f("enable2_pc", BOOL, "6+"),
    f("keep_prepared_txn", BOOL, "6+"),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("producer_id", INT64, default=-1),
    f("producer_epoch", INT16),
    f("ongoing_txn_producer_id", INT64, "6+", default=-1),
    f("ongoing_txn_producer_epoch", INT16, "6+", default=-1),
])

api(32, "DescribeConfigs", "1-4", "4+", request=[
    f("resources", array("DescribeConfigsResource",
        f("resource_type", INT8),
        f("resource_name", STRING),
        f("configuration_keys", array(STRING), nullable="0+"),
    )),
    f("include_synonyms", BOOL, "1+"),
    f("include_documentation", BOOL, "3+"),
], response=[
    f("throttle_time_ms", INT32),
    f("results", array("DescribeConfigsResult",
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+"),
        f("resource_type", INT8),
        f("resource_name", STRING),
        f("configs", array("DescribeConfigsResourceResult",
            f("name", STRING),
            f("value", STRING, nullable="0+"),
            f("read_only", BOOL),
            f("config_source", INT8, "1+", default=-1),
            f("is_default", BOOL, "0"),
            f("is_sensitive", BOOL),
            f("synonyms", array("DescribeConfigsSynonym",
                f("name", STRING),
                f("value", STRING, nullable="0+"),
                f("source", INT8),
            ), "1+"),
            f("config_type", INT8, "3+"),
            f("documentation", STRING, "3+", nullable="0+"),
        )),
    )),
])

api(33, "AlterConfigs", "0-2", "2+", request=[
    f("resources", array("AlterConfigsResource",
        f("resource_type", INT8),
        f("resource_name", STRING),
        f("configs", array("AlterableConfig",
            f("name", STRING),
            f("value", STRING, nullable="0+"),
        )),
    )),
    f("validate_only", BOOL),
], response=[
    f("throttle_time_ms", INT32),
    f("responses", array("AlterConfigsResourceResponse",
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+"),
        f("resource_type", INT8),
        f("resource_name", STRING),
    )),
])

api(44, "IncrementalAlterConfigs", "0-1", "1+", request=[
    f("resources", array("AlterConfigsResource",
        f("resource_type", INT8),
        f("resource_name", STRING),
        f("configs", array("AlterableConfig",
            f("name", STRING),
            f("config_operation", INT8),
            f("value", STRING, nullable="0+"),
        )),
    )),
    f("validate_only", BOOL),
], response=[
    f("throttle_time_ms", INT32),
    f("responses", array("AlterConfigsResourceResponse",
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+"),
        f("resource_type", INT8),
        f("resource_name", STRING),
    )),
])

api(36, "SaslAuthenticate", "0-2", "2+", request=[
    f("auth_bytes", BYTES),
], response=[
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("auth_bytes", BYTES),
    f("session_lifetime_ms", INT64, "1+"),
])

api(37, "CreatePartitions", "0-3", "2+", request=[
    f("topics", array("CreatePartitionsTopic",
        f("name", STRING),
        f("count", INT32),
        f("assignments", array("CreatePartitionsAssignment",
            f("broker_ids", array(INT32)),
        ), nullable="0+"),
    )),
    f("timeout_ms", INT32),
    f("validate_only", BOOL),
], response=[
    f("throttle_time_ms", INT32),
    f("results", array("CreatePartitionsTopicResult",
        f("name", STRING),
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+", default=None),
    )),
])

api(42, "DeleteGroups", "0-2", "2+", request=[
    f("groups_names", array(STRING)),
], response=[
    f("throttle_time_ms", INT32),
    f("results", array("DeletableGroupResult",
        f("group_id", STRING),
        f("error_code", INT16),
    )),
])

api(47, "OffsetDelete", "0", "none", request=[
    f("group_id", STRING),
    f("topics", array("OffsetDeleteRequestTopic",
        f("name", STRING),
        f("partitions", array("OffsetDeleteRequestPartition",
            f("partition_index", INT32),
        )),
    )),
], response=[
    f("error_code", INT16),
    f("throttle_time_ms", INT32),
    f("topics", array("OffsetDeleteResponseTopic",
        f("name", STRING),
        f("partitions", array("OffsetDeleteResponsePartition",
            f("partition_index", INT32),
            f("error_code", INT16),
        )),
    )),
])

api(60, "DescribeCluster", "0-2", "0+", request=[
    f("include_cluster_authorized_operations", BOOL),
    f("endpoint_type", INT8, "1+", default=1),
    f("include_fenced_brokers", BOOL, "2+"),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("endpoint_type", INT8, "1+", default=1),
    f("cluster_id", STRING),
    f("controller_id", INT32, default=-1),
    f("brokers", array("DescribeClusterBroker",
        f("broker_id", INT32),
        f("host", STRING),
        f("port", INT32),
        f("rack", STRING, nullable="0+", default=None),
        f("is_fenced", BOOL, "2+"),
    )),
    f("cluster_authorized_operations", INT32, default=-2147483648),
])

# KIP-848, the consumer group protocol. v1 of the heartbeat adds the topic
# regex and has the consumer make its own member id (KIP-1082); librdkafka 2.16
# sends v1 only.
api(68, "ConsumerGroupHeartbeat", "0-1", "0+", request=[
    f("group_id", STRING),
    f("member_id", STRING),
    f("member_epoch", INT32),
    f("instance_id", STRING, nullable="0+", default=None),
    f("rack_id", STRING, nullable="0+", default=None),
    f("rebalance_timeout_ms", INT32, default=-1),
    f("subscribed_topic_names", array(STRING), nullable="0+", default=None),
    f("subscribed_topic_regex", STRING, "1+", nullable="1+", default=None),
    f("server_assignor", STRING, nullable="0+", default=None),
    f("topic_partitions", array("TopicPartitions",
        f("topic_id", UUID),
        f("partitions", array(INT32)),
    ), nullable="0+", default=None),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("member_id", STRING, nullable="0+", default=None),
    f("member_epoch", INT32),
    f("heartbeat_interval_ms", INT32),
    f("assignment", struct("Assignment",
        f("topic_partitions", array("TopicPartitions",
            f("topic_id", UUID),
            f("partitions", array(INT32)),
        )),
    ), nullable="0+", default=None),
])


def _assignment(name: str) -> Field:
    return f(name, struct("Assignment",
        f("topic_partitions", array("TopicPartitions",
            f("topic_id", UUID),
            f("topic_name", STRING),
            f("partitions", array(INT32)),
        )),
    ))


# v1 adds the member type (KIP-1099: whether a member joined with the classic protocol).
api(69, "ConsumerGroupDescribe", "0-1", "0+", request=[
    f("group_ids", array(STRING)),
    f("include_authorized_operations", BOOL),
], response=[
    f("throttle_time_ms", INT32),
    f("groups", array("DescribedGroup",
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+", default=None),
        f("group_id", STRING),
        f("group_state", STRING),
        f("group_epoch", INT32),
        f("assignment_epoch", INT32),
        f("assignor_name", STRING),
        f("members", array("Member",
            f("member_id", STRING),
            f("instance_id", STRING, nullable="0+", default=None),
            f("rack_id", STRING, nullable="0+", default=None),
            f("member_epoch", INT32),
            f("client_id", STRING),
            f("client_host", STRING),
            f("subscribed_topic_names", array(STRING)),
            f("subscribed_topic_regex", STRING, nullable="0+", default=None),
            _assignment("assignment"),
            _assignment("target_assignment"),
            f("member_type", INT8, "1+", default=-1),
        )),
        f("authorized_operations", INT32, default=-2147483648),
    )),
])


# Share groups (KIP-932), version 1 only: Kafka 4.1's stable version (v0 was
# 4.0's early access, removed since; v2 of ShareFetch and ShareAcknowledge,
# KIP-1206 / KIP-1222's acquire modes and Renew, is Kafka 4.2's and not
# declared). librdkafka 2.16's share consumer sends v1 of each.
api(76, "ShareGroupHeartbeat", "1", "0+", request=[
    f("group_id", STRING),
    f("member_id", STRING),
    f("member_epoch", INT32),
    f("rack_id", STRING, nullable="0+", default=None),
    f("subscribed_topic_names", array(STRING), nullable="0+", default=None),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("member_id", STRING, nullable="0+", default=None),
    f("member_epoch", INT32),
    f("heartbeat_interval_ms", INT32),
    f("assignment", struct("Assignment",
        f("topic_partitions", array("TopicPartitions",
            f("topic_id", UUID),
            f("partitions", array(INT32)),
        )),
    ), nullable="0+", default=None),
])

api(77, "ShareGroupDescribe", "1", "1+", request=[
    f("group_ids", array(STRING)),
    f("include_authorized_operations", BOOL),
], response=[
    f("throttle_time_ms", INT32),
    f("groups", array("DescribedGroup",
        f("error_code", INT16),
        f("error_message", STRING, nullable="0+", default=None),
        f("group_id", STRING),
        f("group_state", STRING),
        f("group_epoch", INT32),
        f("assignment_epoch", INT32),
        f("assignor_name", STRING),
        f("members", array("Member",
            f("member_id", STRING),
            f("rack_id", STRING, nullable="0+", default=None),
            f("member_epoch", INT32),
            f("client_id", STRING),
            f("client_host", STRING),
            f("subscribed_topic_names", array(STRING)),
            _assignment("assignment"),
        )),
        f("authorized_operations", INT32, default=-2147483648),
    )),
])


def _acknowledgement_batches() -> Field:
    return f("acknowledgement_batches", array("AcknowledgementBatch",
        f("first_offset", INT64),
        f("last_offset", INT64),
        f("acknowledge_types", array(INT8)),  # 0 gap, 1 accept, 2 release, 3 reject
    ))


def _share_node_endpoints() -> Field:  # untagged (Fetch's are a tagged field)
    name, fields = _NODE_ENDPOINT
    return f("node_endpoints", array(name, *fields))


def _share_leader() -> Field:  # an untagged LeaderIdAndEpoch (Fetch's is tagged)
    return f("current_leader", struct("LeaderIdAndEpoch",
        f("leader_id", INT32, default=-1),
        f("leader_epoch", INT32, default=-1),
    ))


api(78, "ShareFetch", "1", "0+", request=[
    f("group_id", STRING, nullable="0+", default=None),
    f("member_id", STRING, nullable="0+"),
    f("share_session_epoch", INT32),
    f("max_wait_ms", INT32),
    f("min_bytes", INT32),
    f("max_bytes", INT32, default=0x7FFFFFFF),
    f("max_records", INT32),
    f("batch_size", INT32),
    f("topics", array("FetchTopic",
        f("topic_id", UUID),
        f("partitions", array("FetchPartition",
            f("partition_index", INT32),
            _acknowledgement_batches(),
        )),
    )),
    f("forgotten_topics_data", array("ForgottenTopic",
        f("topic_id", UUID),
        f("partitions", array(INT32)),
    )),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("acquisition_lock_timeout_ms", INT32),
    f("responses", array("ShareFetchableTopicResponse",
        f("topic_id", UUID),
        f("partitions", array("PartitionData",
            f("partition_index", INT32),
            f("error_code", INT16),
            f("error_message", STRING, nullable="0+", default=None),
            f("acknowledge_error_code", INT16),
            f("acknowledge_error_message", STRING, nullable="0+", default=None),
            _share_leader(),
            f("records", RECORDS, default=b""),
            f("acquired_records", array("AcquiredRecords",
                f("first_offset", INT64),
                f("last_offset", INT64),
                f("delivery_count", INT16),
            )),
        )),
    )),
    _share_node_endpoints(),
])

api(79, "ShareAcknowledge", "1", "0+", request=[
    f("group_id", STRING, nullable="0+", default=None),
    f("member_id", STRING, nullable="0+"),
    f("share_session_epoch", INT32),
    f("topics", array("AcknowledgeTopic",
        f("topic_id", UUID),
        f("partitions", array("AcknowledgePartition",
            f("partition_index", INT32),
            _acknowledgement_batches(),
        )),
    )),
], response=[
    f("throttle_time_ms", INT32),
    f("error_code", INT16),
    f("error_message", STRING, nullable="0+", default=None),
    f("responses", array("ShareAcknowledgeTopicResponse",
        f("topic_id", UUID),
        f("partitions", array("PartitionData",
            f("partition_index", INT32),
            f("error_code", INT16),
            f("error_message", STRING, nullable="0+", default=None),
            _share_leader(),
        )),
    )),
    _share_node_endpoints(),
])
