"""Kafka framing, server side: frames split anywhere, the size limit, request headers, what a
broker does with requests it does not serve, and response framing as kafka-python reads it."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.kafka import codec, errors, framing
from tests.server.kafka.support import (
    kafka_python_classes,
    kafka_python_dict,
    message_values,
    to_kafka_python,
    version_dict,
)

SETTINGS = settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))

REQUEST_VERSIONS = [pytest.param(key, v, id=f"{cls.NAME}-v{v}")
                    for key, cls in sorted(codec.REQUESTS.items()) for v in cls.VERSIONS]
RESPONSE_VERSIONS = [pytest.param(key, v, id=f"{cls.NAME}-v{v}")
                     for key, cls in sorted(codec.RESPONSES.items()) for v in cls.VERSIONS]
# Each API's lowest and highest version: with and without flexible headers (every version's
# body is compared with kafka-python's in test_codec.py).
REQUEST_EDGES = [pytest.param(key, v, id=f"{cls.NAME}-v{v}") for key, cls in sorted(codec.REQUESTS.items())
                 for v in sorted({cls.VERSIONS.lo, cls.VERSIONS.hi})]
RESPONSE_EDGES = [pytest.param(key, v, id=f"{cls.NAME}-v{v}") for key, cls in sorted(codec.RESPONSES.items())
                  for v in sorted({cls.VERSIONS.lo, cls.VERSIONS.hi})]
KP = kafka_python_classes()
KP_REQUEST_EDGES = [p for p in REQUEST_EDGES if codec.REQUESTS[p.values[0]].NAME in KP]  # none of KIP-848 or KIP-932
KP_RESPONSE_EDGES = [p for p in RESPONSE_EDGES if codec.RESPONSES[p.values[0]].NAME in KP]


def events(reader: framing.RequestReader) -> list:
    out = []
    while (ev := reader.next_event()) is not None:
        out.append(ev)
    return out


@pytest.mark.parametrize("api_key,version", REQUEST_VERSIONS)
def test_request_split_at_every_byte(api_key, version):
    cls = codec.REQUESTS[api_key]

    @SETTINGS
    @given(message_values(cls, version, max_items=2), st.one_of(st.none(), st.text(max_size=8)),
           st.integers(-(2**31), 2**31 - 1))
    def check(body, client_id, correlation_id):
        frame = framing.encode_request(api_key, version, correlation_id, client_id, body)
        want = framing.Request(api_key, version, correlation_id, client_id, body, len(frame) - 4)
        for i in range(len(frame) + 1):
            reader = framing.RequestReader()
            reader.receive_data(frame[:i])
            assert events(reader) == ([want] if i == len(frame) else [])
            reader.receive_data(frame[i:])
            assert events(reader) == ([] if i == len(frame) else [want])
            assert reader.frames.at_boundary()

    check()


@pytest.mark.parametrize("api_key,version", RESPONSE_VERSIONS)
def test_response_split_at_every_byte(api_key, version):
    cls = codec.RESPONSES[api_key]

    @SETTINGS
    @given(message_values(cls, version, max_items=2), st.integers(-(2**31), 2**31 - 1))
    def check(body, correlation_id):
        data = framing.encode_response(api_key, version, correlation_id, body)
        for i in range(len(data) + 1):
            frames = framing.FrameReader()
            frames.feed(data[:i])
            first = frames.next_frame()
            frames.feed(data[i:])
            frame = first if first is not None else frames.next_frame()
            assert (first is None) == (i < len(data))
            assert framing.decode_response(api_key, version, frame) == (correlation_id, body)
            assert frames.next_frame() is None and frames.at_boundary()

    check()


def test_pipelined_requests_fed_one_byte_at_a_time():
    bodies = [codec.MetadataRequest(topics=None), codec.ApiVersionsRequest(client_software_name="x"),
              codec.HeartbeatRequest(group_id="g", generation_id=3, member_id="m")]
    keys = [3, 18, 12]
    versions = [12, 3, 4]
    stream = b"".join(framing.encode_request(k, v, i, "c", b) for i, (k, v, b) in
                      enumerate(zip(keys, versions, bodies)))
    reader = framing.RequestReader()
    got = []
    for i in range(len(stream)):
        reader.receive_data(stream[i:i + 1])
        got += events(reader)
    assert [(r.api_key, r.api_version, r.correlation_id, r.body) for r in got] == \
        list(zip(keys, versions, range(3), bodies))


@pytest.mark.parametrize("api_key,version", KP_REQUEST_EDGES)
def test_kafka_python_requests_with_their_header_and_frame(api_key, version):
    cls = codec.REQUESTS[api_key]
    kcls = KP[cls.NAME]

    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(message_values(cls, version, unknown_tags=False, max_items=2))
    def check(body):
        k = to_kafka_python(kcls, body, version)
        k.with_header(correlation_id=77, client_id="kafka-python-test")
        reader = framing.RequestReader()
        reader.receive_data(bytes(k.encode(header=True, framed=True)))
        [req] = events(reader)
        assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == \
            (api_key, version, 77, "kafka-python-test")
        assert req.body == body

    check()


@pytest.mark.parametrize("api_key,version", KP_RESPONSE_EDGES)
def test_kafka_python_reads_our_framed_responses(api_key, version):
    cls = codec.RESPONSES[api_key]
    kcls = KP[cls.NAME]
    values = message_values(cls, version, unknown_tags=False, max_items=2)
    if api_key == framing.API_VERSIONS_KEY:
        values = values.filter(lambda o: o.error_code == 0)

    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(values)
    def check(body):
        data = framing.encode_response(api_key, version, 123, body)
        kobj = kcls.decode(data, version=version, header=True, framed=True)
        assert kobj.header.correlation_id == 123
        assert kafka_python_dict(kobj, cls, version) == version_dict(body, version)

    check()


def test_header_versions():
    assert framing.request_header_version(3, 8) == 1
    assert framing.request_header_version(3, 9) == 2
    assert framing.response_header_version(3, 8) == 0
    assert framing.response_header_version(3, 9) == 1
    assert framing.request_header_version(60, 0) == 2  # DescribeCluster is flexible from v0
    # ApiVersions: flexible request header from v3, response header v0 at every version
    assert framing.request_header_version(18, 3) == 2
    assert framing.response_header_version(18, 3) == 0


# --------------------------------------------------------------------------
# Requests a broker does not serve
# --------------------------------------------------------------------------


def raw_frame(api_key: int, version: int, correlation_id: int, rest: bytes = b"\xff\xff") -> bytes:
    body = struct.pack(">hhi", api_key, version, correlation_id) + rest
    return struct.pack(">i", len(body)) + body


@pytest.mark.parametrize("version", [4, 5, 99, -1])
def test_api_versions_at_an_unknown_version_is_answered_at_v0(version):
    reader = framing.RequestReader()
    reader.receive_data(raw_frame(18, version, 41, b"\x00\x05hello\x00garbage that is not parsed"))
    reader.receive_data(framing.encode_request(18, 3, 42, "c", codec.ApiVersionsRequest()))
    answer, retry = events(reader)
    assert isinstance(answer, framing.Answer) and answer.correlation_id == 41
    # kafka-python reads it as Kafka's clients do (error present: read as v0)
    kresp = KP["ApiVersionsResponse"].decode(answer.data, version=version if version >= 0 else 0,
                                             header=True, framed=True)
    assert kresp.header.correlation_id == 41
    assert kresp.error_code == errors.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in kresp.api_keys] == [(18, 0, 3)]
    assert (retry.api_key, retry.api_version, retry.correlation_id) == (18, 3, 42)


def test_kafka_python_negotiates_down_from_api_versions_v4():
    """kafka-python 3 opens with ApiVersions v4 (its newest); the answer leads it to v3."""
    k = KP["ApiVersionsRequest"](version=4, client_software_name="kafka-python", client_software_version="3")
    k.with_header(correlation_id=1, client_id="kp")
    reader = framing.RequestReader()
    reader.receive_data(bytes(k.encode(header=True, framed=True)))
    [answer] = events(reader)
    frames = framing.FrameReader()
    frames.feed(answer.data)
    assert framing.decode_response(18, 0, frames.next_frame())[1].api_keys[0].max_version == 3


@pytest.mark.parametrize("api_key,version", [(43, 0), (999, 1), (-1, 0), (0, 2), (0, 14), (1, 3), (7, 0)])
def test_unserved_api_keys_and_versions_close_with_kafkas_reason(api_key, version):
    reader = framing.RequestReader()
    reader.receive_data(raw_frame(api_key, version, 5))
    with pytest.raises(framing.ProtocolViolation) as e:
        reader.next_event()
    assert e.value.reason == f"Received request api key {api_key} with version {version} which is not enabled"


def test_a_broker_serves_a_subset_of_the_declared_versions():
    reader = framing.RequestReader(served={18: (0, 3), 3: (0, 12)})
    reader.receive_data(framing.encode_request(3, 12, 1, None, codec.MetadataRequest()))
    assert events(reader)[0].api_version == 12
    for key, version in [(3, 13), (0, 9)]:
        reader = framing.RequestReader(served={18: (0, 3), 3: (0, 12)})
        reader.receive_data(raw_frame(key, version, 2))
        with pytest.raises(framing.ProtocolViolation, match="not enabled"):
            reader.next_event()


# --------------------------------------------------------------------------
# Garbage and limits
# --------------------------------------------------------------------------


@pytest.mark.parametrize("first_bytes", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # an HTTP client on the Kafka port
    bytes.fromhex("16030100f4010000f00303"),  # a TLS ClientHello
    b"*1\r\n$4\r\nPING\r\n",  # a Redis client
    b"\xff\xff\xff\xff",  # size -1
    b"\x80\x00\x00\x00",  # most negative size
])
def test_foreign_protocols_are_refused_on_their_first_4_bytes(first_bytes):
    reader = framing.RequestReader()
    with pytest.raises(framing.ProtocolViolation, match="Invalid receive"):
        reader.receive_data(first_bytes)


def test_the_size_limit_is_checked_before_anything_is_buffered():
    reader = framing.RequestReader(max_frame_bytes=1000)
    def metadata(name_bytes):
        return framing.encode_request(3, 1, 1, "c", codec.MetadataRequest(
            topics=[codec.MetadataRequest.MetadataRequestTopic(name="t" * name_bytes)]))
    ok = metadata(1000 - (len(metadata(0)) - 4))
    assert len(ok) == 1004
    reader.receive_data(ok)
    assert events(reader)[0].size_bytes == 1000
    with pytest.raises(framing.ProtocolViolation, match=r"size = 1001 larger than 1000"):
        reader.receive_data(struct.pack(">i", 1001))
    huge = framing.FrameReader()  # default: 100 MiB, as Kafka's socket.request.max.bytes
    with pytest.raises(framing.ProtocolViolation, match="larger than 104857600"):
        huge.feed(struct.pack(">i", 100 * 1024 * 1024 + 1) + b"x" * 10)
    assert huge.buffered_bytes == 0


def test_a_frame_arriving_slowly_is_buffered_only_to_its_size():
    frames = framing.FrameReader()
    frames.feed(struct.pack(">i", 50 * 1024 * 1024))
    for _ in range(4):
        frames.feed(b"\x00" * 1000)
        assert frames.next_frame() is None
    assert frames.buffered_bytes == 4004


@pytest.mark.parametrize("frame,match", [
    (b"", "truncated"), (b"\x00\x03\x00", "truncated"),
    (struct.pack(">hhi", 3, 1, 9), "Error getting request for apiKey: 3, apiVersion: 1, correlationId: 9"),
    (struct.pack(">hhih", 3, 1, 9, 5) + b"ab", "correlationId: 9"),  # client id runs past the end
])
def test_bad_headers_and_bodies_close_the_connection(frame, match):
    reader = framing.RequestReader()
    reader.receive_data(struct.pack(">i", len(frame)) + frame)
    with pytest.raises(framing.ProtocolViolation, match=match):
        reader.next_event()


def test_bytes_after_the_body_are_ignored_as_kafka_does():
    """librdkafka 2.16's Metadata v13 for every topic (its AdminClient's list_topics) carries three
    bytes after the body; Kafka's generated readers stop at the body's end and never look, so the
    request is served. (Refusing it closed every such client's connection.)"""
    frame = bytes.fromhex("0003000d00000003000772646b61666b610000000000010000")
    reader = framing.RequestReader()
    reader.receive_data(struct.pack(">i", len(frame)) + frame)
    request = reader.next_event()
    assert (request.api_key, request.api_version, request.correlation_id) == (3, 13, 3)
    assert request.body.topics is None and request.size_bytes == len(frame)


@settings(max_examples=400, deadline=None, database=None)
@given(st.sampled_from(sorted({(k, v) for k, c in codec.REQUESTS.items() for v in c.VERSIONS} | {(18, 7), (77, 0)})),
       st.binary(max_size=80))
def test_garbage_after_a_valid_api_key_never_escapes_as_another_exception(key_version, rest):
    reader = framing.RequestReader()
    reader.receive_data(raw_frame(*key_version, 1, rest))
    try:
        ev = reader.next_event()
    except framing.ProtocolViolation:
        return
    assert isinstance(ev, (framing.Request, framing.Answer))


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=200))
def test_any_byte_stream_gives_requests_need_data_or_a_violation(data):
    reader = framing.RequestReader(max_frame_bytes=150)
    try:
        reader.receive_data(data)
        events(reader)
    except framing.ProtocolViolation:
        pass
    assert reader.frames.buffered_bytes <= len(data)
