"""The generated Kafka codec: every declared message at every version round-trips, encodes
byte for byte as kafka-python's encoder (generated from Kafka's own JSON definitions) does,
and refuses bad input with DecodeError only."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.kafka import codec, schema
from tests.server.kafka.support import (
    kafka_python_classes,
    kafka_python_dict,
    message_values,
    to_kafka_python,
    version_dict,
)

SETTINGS = settings(max_examples=8, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

ALL_VERSIONS = [
    pytest.param(name, v, id=f"{name}-v{v}")
    for name, cls in sorted(codec.MESSAGES.items())
    for v in cls.VERSIONS
]
API_VERSIONS = [p for p in ALL_VERSIONS if codec.MESSAGES[p.values[0]].SCHEMA.kind != "header"]


def test_every_api_of_the_issue_is_declared_request_and_response():
    wanted = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
              9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
              13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 16: "ListGroups",
              17: "SaslHandshake", 18: "ApiVersions", 19: "CreateTopics", 20: "DeleteTopics", 22: "InitProducerId",
              32: "DescribeConfigs", 33: "AlterConfigs", 36: "SaslAuthenticate", 37: "CreatePartitions",
              42: "DeleteGroups", 44: "IncrementalAlterConfigs", 47: "OffsetDelete", 60: "DescribeCluster", 68: "ConsumerGroupHeartbeat",
              69: "ConsumerGroupDescribe", 76: "ShareGroupHeartbeat", 77: "ShareGroupDescribe", 78: "ShareFetch",
              79: "ShareAcknowledge"}
    assert {k: c.NAME for k, c in codec.REQUESTS.items()} == {k: n + "Request" for k, n in wanted.items()}
    assert {k: c.NAME for k, c in codec.RESPONSES.items()} == {k: n + "Response" for k, n in wanted.items()}
    for key, req in codec.REQUESTS.items():
        assert codec.RESPONSES[key].VERSIONS == req.VERSIONS
    assert codec.ApiVersionsRequest.VERSIONS == schema.Versions(0, 3)


@pytest.mark.parametrize("name,version", ALL_VERSIONS)
def test_round_trip(name, version):
    cls = codec.MESSAGES[name]

    @SETTINGS
    @given(message_values(cls, version))
    def check(obj):
        data = obj.encode(version)
        assert cls.decode(data, version) == obj
        # decode_from inside a larger buffer stops at the message's end
        back, end = cls.decode_from(b"\x00" * 3 + data + b"\xff", 3, version)
        assert back == obj and end == 3 + len(data)

    check()


KP = kafka_python_classes()
# kafka-python 3 declares no KIP-848 message: librdkafka checks those (tests/e2e/test_kafka_consumer_protocol.py)
KP_VERSIONS = [p for p in API_VERSIONS if p.values[0] in KP]


@pytest.mark.parametrize("name,version", KP_VERSIONS)
def test_same_bytes_as_kafka_python(name, version):
    """Ours and kafka-python's encoders agree byte for byte, and each decodes the other's bytes."""
    cls = codec.MESSAGES[name]
    kcls = KP.get(name)
    if kcls is None:  # kafka-python 3 declares no share group message (KIP-932)
        pytest.skip(f"kafka-python has no {name}")
    values = message_values(cls, version, unknown_tags=False)
    if name == "ApiVersionsResponse":
        # kafka-python reads an ApiVersions answer with an error as v0, as Kafka's clients do
        values = values.filter(lambda o: o.error_code == 0)

    @settings(SETTINGS, max_examples=5)
    @given(values)
    def check(obj):
        ours = obj.encode(version)
        theirs = bytes(to_kafka_python(kcls, obj, version).encode(version=version))
        assert ours == theirs
        assert cls.decode(theirs, version) == obj
        assert kafka_python_dict(kcls.decode(ours, version=version), cls, version) == version_dict(obj, version)

    check()


@pytest.mark.parametrize("flexible", [False, True])
def test_headers_as_kafka_python_writes_them(flexible):
    from kafka.protocol.api_header import RequestHeader as KRequestHeader
    from kafka.protocol.api_header import ResponseHeader as KResponseHeader

    for client_id in ("kafka-python", None, "ünï"):
        k = KRequestHeader(request_api_key=3, request_api_version=12, correlation_id=-7, client_id=client_id)
        data = bytes(k.encode(flexible=flexible))
        h = codec.RequestHeader.decode(data, 2 if flexible else 1)
        assert (h.request_api_key, h.request_api_version, h.correlation_id, h.client_id) == (3, 12, -7, client_id)
        assert h.encode(2 if flexible else 1) == data
    data = bytes(KResponseHeader(correlation_id=99).encode(flexible=flexible))
    assert codec.ResponseHeader(correlation_id=99).encode(1 if flexible else 0) == data


# A declaration of every field type, to cover what no declared message uses (uint16, uint32,
# float64, nullable bytes, arrays of strings and uuids, a tagged struct, a nullable array...).
EVERY_TYPE = codec.build(schema.define("response", None, "EveryType", "0-2", "1+", [
    schema.f("b", schema.BOOL),
    schema.f("i8", schema.INT8),
    schema.f("i16", schema.INT16),
    schema.f("u16", schema.UINT16),
    schema.f("i32", schema.INT32),
    schema.f("u32", schema.UINT32),
    schema.f("i64", schema.INT64),
    schema.f("f64", schema.FLOAT64),
    schema.f("id", schema.UUID),
    schema.f("s", schema.STRING),
    schema.f("ns", schema.STRING, nullable="0+", default=None),
    schema.f("by", schema.BYTES),
    schema.f("nby", schema.BYTES, nullable="0+", default=None),
    schema.f("recs", schema.RECORDS, nullable="0+"),
    schema.f("strings", schema.array(schema.STRING)),
    schema.f("ids", schema.array(schema.UUID), nullable="0+"),
    schema.f("i64s", schema.array(schema.INT64)),
    schema.f("flags", schema.array(schema.BOOL)),
    schema.f("items", schema.array("Item",
        schema.f("name", schema.STRING),
        schema.f("later", schema.INT32, "2+", default=-1),
        schema.f("note", schema.STRING, "1+", tag=0, nullable="1+", default=None),
    )),
    schema.f("since2", schema.INT64, "2+", default=-5),
    schema.f("extra", schema.struct("Extra",
        schema.f("x", schema.INT32, default=-1),
        schema.f("words", schema.array(schema.STRING)),
    ), "1+", tag=4),
    schema.f("tagged_i", schema.INT32, "1+", tag=1, default=7),
    schema.f("maybe", schema.struct("Maybe",
        schema.f("y", schema.INT16),
    ), "2+", nullable="2+", default=None),
]))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_every_field_type_round_trips(version):
    @settings(max_examples=60, deadline=None, database=None)
    @given(message_values(EVERY_TYPE, version))
    def check(obj):
        assert EVERY_TYPE.decode(obj.encode(version), version) == obj

    check()


def test_known_bytes_of_every_field_type():
    obj = EVERY_TYPE(b=True, i8=-1, i16=2, u16=65535, i32=-3, u32=2**32 - 1, i64=2**40, f64=1.5,
                     id=uuid.UUID(int=1), s="é", ns=None, by=b"\x00", nby=None, recs=b"r",
                     strings=["a", ""], ids=None, i64s=[1], flags=[True, False],
                     items=[EVERY_TYPE.Item(name="n", note="t")], since2=9,
                     extra=EVERY_TYPE.Extra(x=1), tagged_i=7)
    fixed = bytes.fromhex("01" "ff" "0002" "ffff" "fffffffd" "ffffffff" "0000010000000000" "3ff8000000000000") \
        + (1).to_bytes(16, "big")
    assert obj.encode(0) == fixed + bytes.fromhex(
        "0002c3a9" "ffff" "0000000100" "ffffffff" "0000000172"
        "00000002" "000161" "0000" "ffffffff" "00000001" "0000000000000001" "00000002" "0100"
        "00000001" "00016e")
    assert obj.encode(2) == fixed + bytes.fromhex(
        "03c3a9" "00" "0200" "00" "0272"
        "03" "0261" "01" "00" "02" "0000000000000001" "03" "0100"
        "02" "026e" "ffffffff" "01" "00020274"  # item: name, later=-1, one tag (0: "t")
        "0000000000000009"
        "ff"  # maybe: a null struct (KIP-893's presence byte -1)
        "01" "04" "06" "00000001" "01" "00")  # tag 4, 6 bytes: x=1, no words, no tags; tagged_i=7 is default
    obj.maybe = EVERY_TYPE.Maybe(y=5)
    present = obj.encode(2)
    assert bytes.fromhex("0000000000000009" "01" "0005" "00" "01" "04") in present  # present: 1, y, no tags
    assert EVERY_TYPE.decode(present, 2).maybe == EVERY_TYPE.Maybe(y=5)
    with pytest.raises(codec.DecodeError):
        EVERY_TYPE.decode(present.replace(bytes.fromhex("0000000000000009" "01"),
                                          bytes.fromhex("0000000000000009" "02")), 2)


NULLABLE_STRUCT = codec.build(schema.define("response", None, "NullableStruct", "0-1", "1+", [
    schema.f("before", schema.INT8),
    schema.f("inner", schema.struct("Inner", schema.f("x", schema.INT32)), nullable="0+", default=None),
    schema.f("after", schema.INT8),
]))


@pytest.mark.parametrize("version", [0, 1])
def test_a_nullable_struct_is_a_presence_byte_then_the_struct(version):
    """KIP-893 (ConsumerGroupHeartbeat's assignment): -1 for null, 1 then the struct."""
    tags = "00" if version else ""
    empty = NULLABLE_STRUCT(before=1, after=2)
    assert empty.inner is None
    assert bytes(empty.encode(version)).hex() == "01" "ff" "02" + tags
    full = NULLABLE_STRUCT(before=1, inner=NULLABLE_STRUCT.Inner(x=3), after=2)
    assert bytes(full.encode(version)).hex() == "01" "01" "00000003" + tags + "02" + tags
    for obj in (empty, full):
        assert NULLABLE_STRUCT.decode(obj.encode(version), version) == obj
    with pytest.raises(codec.DecodeError):
        NULLABLE_STRUCT.decode(b"\x01", version)


@pytest.mark.parametrize("value,encoded", [
    (0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (300, "ac02"), (2**32 - 1, "ffffffff0f")])
def test_unsigned_varint(value, encoded):
    out = bytearray()
    codec.write_uvarint(out, value)
    assert out.hex() == encoded
    assert codec.read_uvarint(bytes.fromhex(encoded), 0) == (value, len(encoded) // 2)


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trip(n):
    out = bytearray()
    codec.write_varlong(out, n)
    assert codec.read_varlong(bytes(out), 0) == (n, len(out))


def test_unsigned_varint_longer_than_5_bytes_is_refused():
    with pytest.raises(codec.DecodeError):
        codec.read_uvarint(b"\xff\xff\xff\xff\xff\x01", 0)


@pytest.mark.parametrize("name,version", ALL_VERSIONS)
def test_garbage_raises_only_decode_error(name, version):
    cls = codec.MESSAGES[name]

    @settings(max_examples=15, deadline=None, database=None)
    @given(st.binary(max_size=64))
    def check(data):
        try:
            cls.decode(data, version)
        except codec.DecodeError:
            pass

    check()


@pytest.mark.parametrize("name,version", ALL_VERSIONS)
def test_every_truncation_and_every_flipped_byte_raises_only_decode_error(name, version):
    cls = codec.MESSAGES[name]

    @settings(SETTINGS, max_examples=2)
    @given(message_values(cls, version, max_items=2), st.integers(0, 255))
    def check(obj, xor):
        data = obj.encode(version)
        for i in range(len(data)):
            with pytest.raises(codec.DecodeError):
                cls.decode(data[:i], version)
            try:
                cls.decode(data[:i] + bytes([data[i] ^ (xor or 1)]) + data[i + 1:], version)
            except codec.DecodeError:
                pass

    check()


def test_huge_counts_and_lengths_are_refused_before_allocating():
    # Metadata v1: topics is an int32-counted array; claim 2**31-1 topics in 4 bytes.
    with pytest.raises(codec.DecodeError, match="2147483647 items"):
        codec.MetadataRequest.decode(b"\x7f\xff\xff\xff" + b"\x00" * 4, 1)
    # Produce v9 (flexible): a compact string of 2**32-2 bytes
    with pytest.raises(codec.DecodeError, match="bytes declared"):
        codec.ProduceRequest.decode(b"\xff\xff\xff\xff\x0f", 9)
    # int32 array of broker ids with a huge count (CreatePartitions v0)
    data = codec.CreatePartitionsRequest(topics=[codec.CreatePartitionsRequest.CreatePartitionsTopic(
        name="t", assignments=[codec.CreatePartitionsRequest.CreatePartitionsAssignment(broker_ids=[1])])]).encode(0)
    bad = data.replace(b"\x00\x00\x00\x01\x00\x00\x00\x01", b"\x00\x00\x00\x01\x40\x00\x00\x00", 1)
    with pytest.raises(codec.DecodeError):
        codec.CreatePartitionsRequest.decode(bad, 0)


def test_null_where_not_nullable_and_overlong_strings_are_encode_errors():
    with pytest.raises(codec.EncodeError, match="not nullable"):
        codec.MetadataRequest(topics=None).encode(0)
    assert codec.MetadataRequest.decode(codec.MetadataRequest(topics=None).encode(1), 1).topics is None
    with pytest.raises(codec.EncodeError, match="32767"):
        codec.FindCoordinatorRequest(key="x" * 40000).encode(0)
    with pytest.raises(codec.EncodeError):
        codec.HeartbeatRequest(generation_id=2**31).encode(0)
    with pytest.raises(codec.EncodeError, match="surrogates"):
        codec.HeartbeatRequest(group_id="\udc80").encode(0)
    with pytest.raises(codec.EncodeError, match="no version 99"):
        codec.HeartbeatRequest().encode(99)
    with pytest.raises(codec.DecodeError, match="no version 99"):
        codec.HeartbeatRequest.decode(b"", 99)


def test_unknown_tagged_fields_are_kept_and_written_back():
    # ApiVersions v3 response with a tag 9 the declarations do not know, after the known tag 1
    known = codec.ApiVersionsResponse(finalized_features_epoch=5)
    data = bytearray(known.encode(3))
    assert data.endswith(bytes.fromhex("01" "01" "08" "0000000000000005"))
    data[-11:] = bytes.fromhex("02" "01" "08" "0000000000000005" "09" "02" "abcd")
    obj = codec.ApiVersionsResponse.decode(bytes(data), 3)
    assert obj.finalized_features_epoch == 5
    assert obj._unknown_tags == {9: b"\xab\xcd"}
    assert obj.encode(3) == bytes(data)


def test_fields_absent_from_a_version_take_their_defaults():
    old = codec.FetchRequest.decode(codec.FetchRequest(max_wait_ms=5).encode(4), 4)
    assert (old.session_epoch, old.max_bytes, old.rack_id, old.replica_state.replica_epoch) == (-1, 0x7FFFFFFF, "", -1)
    assert old.replica_id == -1
    assert old.to_dict()["topics"] == []
