"""Helpers for the stream and keyspace end-to-end tests (not a test module).

``RespClient`` is a tiny blocking RESP client that returns each reply's exact
bytes, so differential tests compare Partita and the real redis-server byte
for byte, in RESP2 or RESP3. ``parse`` turns reply bytes into Python values
where a test must look inside (XINFO fields, KEYS order).
"""

from __future__ import annotations

import socket

# Redis 8.6's idempotence fields (XADD IDMP), which the differential tests'
# redis-server (7.0) does not have; tests/e2e/test_idmp.py checks them.
IDEMPOTENCE_XINFO_FIELDS = (b"idmp-duration", b"idmp-maxsize", b"pids-tracked", b"iids-tracked", b"iids-added",
                            b"iids-duplicates")


def port_of(server) -> int:
    return server if isinstance(server, int) else server.port


class RespClient:
    """One connection; ``call`` sends one command and returns its reply's bytes."""

    def __init__(self, port: int, protocol: int = 2, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.file = self.sock.makefile("rb")
        if protocol == 3:
            reply = self.call(b"HELLO", b"3")
            assert reply.startswith(b"%"), reply

    def send(self, *argv) -> None:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in argv]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def read_reply(self) -> bytes:
        line = self.file.readline()
        if not line:
            raise ConnectionError("connection closed")
        out = [line]
        kind = line[:1]
        if kind in (b"$", b"="):
            n = int(line[1:-2])
            if n >= 0:
                out.append(self.file.read(n + 2))
        elif kind in (b"*", b"~", b">", b"%"):
            n = int(line[1:-2])
            for _ in range(max(n, 0) * (2 if kind == b"%" else 1)):
                out.append(self.read_reply())
        return b"".join(out)

    def call(self, *argv) -> bytes:
        self.send(*argv)
        return self.read_reply()

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def blocked_clients(port: int) -> int:
    """INFO clients' ``blocked_clients`` of the server on ``port``."""
    with RespClient(port) as c:
        info = parse(c.call("INFO", "clients")).decode()
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("blocked_clients:")))


class Error(str):
    """An error reply (``-ERR ...``) after ``parse``."""


def parse(data: bytes):
    """RESP bytes -> Python values (maps become lists of pairs)."""
    value, pos = _parse(data, 0)
    assert pos == len(data), "trailing bytes"
    return value


def _parse(data: bytes, pos: int):
    end = data.index(b"\r\n", pos)
    kind, body = data[pos : pos + 1], data[pos + 1 : end]
    pos = end + 2
    if kind in (b"+",):
        return body, pos
    if kind == b"-":
        return Error(body.decode()), pos
    if kind == b":":
        return int(body), pos
    if kind in (b"$", b"="):
        n = int(body)
        if n < 0:
            return None, pos
        return data[pos : pos + n], pos + n + 2
    if kind == b"_":
        return None, pos
    if kind == b"#":
        return body == b"t", pos
    if kind == b",":
        return float(body), pos
    if kind in (b"*", b"~", b">"):
        n = int(body)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            item, pos = _parse(data, pos)
            items.append(item)
        return items, pos
    if kind == b"%":
        items = []
        for _ in range(int(body)):
            k, pos = _parse(data, pos)
            v, pos = _parse(data, pos)
            items.append((k, v))
        return items, pos
    raise AssertionError(f"unknown RESP type {kind!r}")


def info_pairs(reply: bytes) -> list:
    """XINFO STREAM reply -> [(field, value)] in order, RESP2 or RESP3."""
    value = parse(reply)
    if value and isinstance(value[0], tuple):
        return value
    return list(zip(value[0::2], value[1::2]))


def without_idempotence_fields(pairs: list) -> list:
    """XINFO STREAM's pairs without Redis 8.6's idempotence fields, which the
    reference redis-server (7.0) does not show."""
    return [(k, v) for k, v in pairs if k not in IDEMPOTENCE_XINFO_FIELDS]


class Map(list):
    """A map reply to ``encode``: a list of (key, value) pairs, in order."""


class Simple(str):
    """A simple-string reply to ``encode`` (``+OK``)."""


class Null:
    """A null reply to ``encode``: ``$-1`` in RESP2 (``*-1`` when ``array``), ``_`` in RESP3."""

    def __init__(self, array: bool = False) -> None:
        self.array = array


def encode(value, protocol: int = 2) -> bytes:
    """The exact bytes Redis sends for ``value`` (a specification's expected
    reply): str/bytes bulk strings, ints, lists, ``Map``, ``Simple``,
    ``Error`` (``-...``), ``Null``."""
    if isinstance(value, Error):
        return b"-%s\r\n" % value.encode()
    if isinstance(value, Simple):
        return b"+%s\r\n" % value.encode()
    if isinstance(value, Null):
        return b"_\r\n" if protocol == 3 else (b"*-1\r\n" if value.array else b"$-1\r\n")
    if isinstance(value, bool):
        raise TypeError("no booleans in these replies")
    if isinstance(value, int):
        return b":%d\r\n" % value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes):
        return b"$%d\r\n%s\r\n" % (len(value), value)
    if isinstance(value, Map):
        if protocol == 3:
            return b"%%%d\r\n" % len(value) + b"".join(encode(k, 3) + encode(v, 3) for k, v in value)
        return b"*%d\r\n" % (2 * len(value)) + b"".join(encode(k, 2) + encode(v, 2) for k, v in value)
    if isinstance(value, list):
        return b"*%d\r\n" % len(value) + b"".join(encode(v, protocol) for v in value)
    raise TypeError(f"cannot encode {value!r}")
