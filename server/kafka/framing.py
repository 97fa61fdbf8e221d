"""Sans-IO framing of the Kafka protocol, server side: bytes in, requests out.

Owns: the size-prefixed frame (int32 size, then that many bytes), the frame
size limit (Kafka's ``socket.request.max.bytes``, 100 MiB by default), the
request header and which header version an API and version use, decoding the
body with ``server.kafka.codec``, what happens to a request the broker does
not serve, and the framing of responses (size, response header, body).
"Need more data" is the normal ``None`` return of ``next_event``.

Must not know: sockets, trio, what any API does, the broker.

What a Kafka broker does with a request it does not serve, and what this
module does the same way (Kafka's ``SocketServer.parseRequestHeader``,
``ApiKeys.isVersionEnabled``, ``ApiVersionsRequest.getErrorResponse``):

- ApiVersions at a version the broker does not know is answered, not refused:
  a v0 response (v0 header) with error UNSUPPORTED_VERSION (35) and, in its
  ``api_keys``, the ApiVersions range the broker serves, so the client can
  retry at a version both know (KIP-511). The body is not parsed: a client
  sends its newest version first and cannot know what the broker reads.
- Any other API key or version outside what the broker serves (an unknown
  key, a known API the broker does not implement, a version out of range):
  Kafka throws ``InvalidRequestException("Received request api key K with
  version V which is not enabled")`` and closes the connection, logging that
  reason. A response is impossible: the client would read it with the
  response schema of a version the broker does not know. ``next_event``
  raises ``ProtocolViolation`` with Kafka's reason; the adapter logs it and
  closes. Clients only send what ApiVersions advertised, so a well-behaved
  client never meets this.
- A frame whose size is negative or above the limit (a stray HTTP or TLS
  client's first bytes read as a size are far above it), a header or body
  that does not decode: Kafka closes the connection
  (``InvalidReceiveException``, ``InvalidRequestException``); so does this,
  via ``ProtocolViolation``. Bytes after a body that decodes are ignored, as
  Kafka's readers ignore them (librdkafka 2.16 sends some). The size is checked as soon as its 4
  bytes arrive, before anything of the frame is kept.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import NamedTuple

from server.kafka import codec
from server.kafka.errors import UNSUPPORTED_VERSION

REQUEST_MAX_BYTES_DEFAULT = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
API_VERSIONS_KEY = 18

_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">hhi")  # api key, api version, correlation id: every header version starts so


class ProtocolViolation(Exception):
    """The peer sent something a Kafka broker closes the connection for; ``reason`` says what."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Request(NamedTuple):
    """A decoded request: header fields and the body (a ``codec`` message object)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: codec.KafkaMessage
    size_bytes: int  # the frame's size, header included (for request metrics and limits)


class Answer(NamedTuple):
    """A response the framing gives by itself (ApiVersions at an unknown version); send ``data``."""

    correlation_id: int
    data: bytes


def declared_versions() -> dict[int, tuple[int, int]]:
    """Every API key with the versions ``server.kafka.schema`` declares."""
    return {k: (m.VERSIONS.lo, m.VERSIONS.hi) for k, m in codec.REQUESTS.items()}


def request_header_version(api_key: int, api_version: int) -> int:
    """2 for flexible request versions (tagged fields), else 1."""
    msg = codec.REQUESTS.get(api_key)
    return 2 if msg is not None and api_version in msg.FLEXIBLE else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """1 for flexible response versions, else 0; ApiVersions always 0.

    ApiVersions' response header stays v0 at every version so that a client
    can read the answer before it knows which versions the broker speaks.
    """
    if api_key == API_VERSIONS_KEY:
        return 0
    msg = codec.RESPONSES.get(api_key)
    return 1 if msg is not None and api_version in msg.FLEXIBLE else 0


def encode_response(api_key: int, api_version: int, correlation_id: int,
                    body: codec.KafkaMessage) -> bytearray:
    """Size prefix, response header and ``body`` encoded at ``api_version``
    (the buffer it was encoded into: a Fetch response's megabytes are not
    copied once more).

    Raises:
        codec.EncodeError: the body does not fit that version.
    """
    out = bytearray(4)
    out += _SIZE.pack(correlation_id)
    if response_header_version(api_key, api_version) == 1:
        out.append(0)  # no tagged fields in the header
    body.encode_into(out, api_version)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return out


def unsupported_api_versions_answer(correlation_id: int, api_versions_range: tuple[int, int]) -> bytes:
    """Kafka's answer to ApiVersions at a version it does not know (v0, UNSUPPORTED_VERSION)."""
    resp = codec.ApiVersionsResponse(
        error_code=UNSUPPORTED_VERSION,
        api_keys=[codec.ApiVersionsResponse.ApiVersion(
            api_key=API_VERSIONS_KEY, min_version=api_versions_range[0],
            max_version=api_versions_range[1])],
    )
    return bytes(encode_response(API_VERSIONS_KEY, 0, correlation_id, resp))


class FrameReader:
    """Size-prefixed frames out of a byte stream; ``next_frame`` is None until one is whole.

    The size is checked against ``max_frame_bytes`` as soon as its 4 bytes
    arrive; an oversized or negative one raises ``ProtocolViolation`` before
    anything of the frame is kept, so the buffer holds at most one allowed
    frame plus whatever one ``feed`` brought beyond it.
    """

    def __init__(self, max_frame_bytes: int = REQUEST_MAX_BYTES_DEFAULT) -> None:
        assert max_frame_bytes > 0
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._size = -1  # size of the frame being read, -1 until its prefix is in

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data) -> None:
        self._buf += data
        if self._size < 0:
            self._check_size()

    def _check_size(self) -> None:
        if len(self._buf) < 4:
            return
        size, = _SIZE.unpack_from(self._buf, 0)
        if size < 0 or size > self.max_frame_bytes:
            self._buf.clear()
            raise ProtocolViolation(
                f"Invalid receive (size = {size} larger than {self.max_frame_bytes})" if size >= 0
                else f"Invalid receive (size = {size})")
        self._size = size

    def next_frame(self) -> bytes | None:
        """The next whole frame's bytes (without the size prefix), or None: need more data.

        The size of the frame after it is checked at the next call (or
        ``feed``), against ``max_frame_bytes`` as it is then: a reader may
        change the limit between frames (Kafka's smaller one before a client
        has authenticated).
        """
        if self._size < 0:
            self._check_size()
        size = self._size
        if size < 0:
            return None
        end = 4 + size
        buf = self._buf
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            frame = bytes(view[4:end])  # one copy (a slice of the bytearray would be a second)
        del buf[:end]  # (cheap: a bytearray drops its head by moving its start)
        self._size = -1
        return frame

    def at_boundary(self) -> bool:
        """True when no partial frame is buffered (a clean place for the peer to stop)."""
        return not self._buf


class RequestReader:
    """Requests out of a client's byte stream, as a Kafka broker reads them.

    ``served`` maps each API key the broker serves to its (min, max) version;
    ApiVersions must be in it. Requests outside it are handled as Kafka does
    (module docstring). ``receive_data`` then ``next_event`` until it returns
    None; ``ProtocolViolation`` means: log the reason, close the connection.
    """

    def __init__(self, served: Mapping[int, tuple[int, int]] | None = None,
                 max_frame_bytes: int = REQUEST_MAX_BYTES_DEFAULT) -> None:
        self.served = dict(declared_versions() if served is None else served)
        assert API_VERSIONS_KEY in self.served, "a Kafka broker always serves ApiVersions"
        for key, (lo, hi) in self.served.items():
            msg = codec.REQUESTS.get(key)
            assert msg is not None and lo in msg.VERSIONS and hi in msg.VERSIONS, (key, lo, hi)
        self.frames = FrameReader(max_frame_bytes)

    def receive_data(self, data) -> None:
        """Buffer bytes from the peer.

        Raises:
            ProtocolViolation: a frame size below 0 or above the limit.
        """
        self.frames.feed(data)

    def next_event(self) -> Request | Answer | None:
        """The next request, an answer to send at once, or None (need more data).

        Raises:
            ProtocolViolation: the request cannot be served; close the connection.
        """
        frame = self.frames.next_frame()
        if frame is None:
            return None
        return self.parse_frame(frame)

    def parse_frame(self, frame: bytes) -> Request | Answer:
        if len(frame) < _HEAD.size:
            raise ProtocolViolation(f"Request header of {len(frame)} bytes is truncated")
        api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
        versions = self.served.get(api_key)
        if versions is None or not versions[0] <= api_version <= versions[1]:
            if api_key == API_VERSIONS_KEY:
                return Answer(correlation_id, unsupported_api_versions_answer(correlation_id, versions))
            raise ProtocolViolation(
                f"Received request api key {api_key} with version {api_version} which is not enabled")
        header_version = request_header_version(api_key, api_version)
        try:
            header, pos = codec.RequestHeader.decode_from(frame, 0, header_version)
            body, pos = codec.REQUESTS[api_key].decode_from(frame, pos, api_version)
        except codec.DecodeError as e:
            raise ProtocolViolation(
                f"Error getting request for apiKey: {api_key}, apiVersion: {api_version}, "
                f"correlationId: {correlation_id}: {e}") from None
        # Bytes after the body are not looked at, as Kafka's generated readers
        # do not: librdkafka 2.16 sends three after its Metadata v13 for every
        # topic, and Kafka serves it.
        return Request(api_key, api_version, correlation_id, header.client_id, body, len(frame))


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: codec.KafkaMessage) -> bytes:
    """A client's framed request (for tests, benchmarks and a future client side)."""
    out = bytearray(4)
    header = codec.RequestHeader(request_api_key=api_key, request_api_version=api_version,
                                 correlation_id=correlation_id, client_id=client_id)
    header.encode_into(out, request_header_version(api_key, api_version))
    body.encode_into(out, api_version)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return out


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, codec.KafkaMessage]:
    """A client's view: ``(correlation_id, body)`` of a response frame (no size prefix).

    Raises:
        codec.DecodeError: not a valid response at that version.
    """
    header, pos = codec.ResponseHeader.decode_from(frame, 0, response_header_version(api_key, api_version))
    body, pos = codec.RESPONSES[api_key].decode_from(frame, pos, api_version)
    if pos != len(frame):
        raise codec.DecodeError(f"{len(frame) - pos} bytes after the response body")
    return header.correlation_id, body
