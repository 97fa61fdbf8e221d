"""Redis 8 stream behaviour that differs from Redis 7.0, as specifications.

No Redis 8 binary runs here (the differential tests compare with redis-server
7.0 where 7.0 and 8 agree), so these expect the replies Redis 8.10's command
pages, their histories and its release notes describe, byte for byte where
nothing varies (RESP2 and RESP3), through a real ``partita`` process and
through redis-py's own methods:

- XINFO STREAM / FULL: Redis 8's fields in its order and nothing else;
  XINFO CONSUMERS ``idle``/``inactive`` and FULL's ``seen-time``/``active-time``
  as 7.2 defined them (every XREADGROUP attempt creates its consumer);
- a blocked XREADGROUP whose key or group goes away: the command's own
  NOGROUP (7.2+ runs a woken command again); a blocked XREAD's deleted key
  blocks on;
- lag and entries-read as Redis 8.2.2+ computes them (redis #13338, #13473,
  #13958; XGROUP ENTRIESREAD at most entries-added, #14259);
- XSETID's 7.2+ checks, and XSETID on a stream trimmed empty;
- ``<ms>-*`` after ``<ms>-<max seq>``, and XREAD / XREADGROUP unbalanced
  stream lists (7.4's texts naming the command);
- ``XREAD ... +`` (7.4).
"""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.e2e.streams_support import Error, Map, Null, RespClient, Simple, encode, info_pairs, parse, port_of

PROTOCOLS = pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])

XADD_ID_TOO_SMALL = Error("ERR The ID specified in XADD is equal or smaller than the target stream top item")
NOGROUP_TO_READ = Error("NOGROUP No such key 's' or consumer group 'g' in XREADGROUP with GROUP option")


def _fields(reply) -> dict:
    """A map reply parsed (``parse``) -> dict, RESP2 (flat) or RESP3 (pairs)."""
    if reply and isinstance(reply[0], tuple):
        return dict(reply)
    return dict(zip(reply[0::2], reply[1::2]))


@pytest.fixture
def client(partita_shared):
    opened = []

    def connect(protocol: int = 2) -> RespClient:
        c = RespClient(port_of(partita_shared), protocol)
        opened.append(c)
        return c

    connect(2).call("FLUSHALL")
    yield connect
    for c in opened:
        c.close()


def _blocked_clients(port: int) -> int:
    with RespClient(port) as c:
        info = parse(c.call("INFO", "clients")).decode()
    return int(next(line.split(":")[1] for line in info.splitlines() if line.startswith("blocked_clients:")))


# ------------------------------------------------------------------ XINFO


# ------------------------------------------------------------ unblocking


@PROTOCOLS
@pytest.mark.parametrize("how", ["del", "flushall", "destroy"])
def test_blocked_xreadgroup_whose_key_or_group_goes_gets_the_commands_nogroup(partita_shared, client, protocol,
                                                                                 how):
    admin = client(2)
    reader = client(protocol)
    admin.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    reader.send("XREADGROUP", "GROUP", "g", "c", "BLOCK", "0", "STREAMS", "s", ">")
    assert wait_for(lambda: _blocked_clients(partita_shared.port) == 1)
    {"del": lambda: admin.call("DEL", "s"), "flushall": lambda: admin.call("FLUSHALL"),
     "destroy": lambda: admin.call("XGROUP", "DESTROY", "s", "g")}[how]()
    assert reader.read_reply() == encode(NOGROUP_TO_READ, protocol)


def test_blocked_xread_whose_key_is_deleted_blocks_on(partita_shared, client):
    """Redis 7.2's "Blocking XREAD: key deleted": the read is not refused; an
    entry added to the re-created key after the position is served."""
    admin = client(2)
    reader = client(2)
    admin.call("XADD", "s", "666-0", "f", "v")
    reader.send("XREAD", "BLOCK", "0", "STREAMS", "s", "$")
    assert wait_for(lambda: _blocked_clients(partita_shared.port) == 1)
    admin.call("DEL", "s")
    admin.call("XADD", "s", "667-0", "f", "v")
    assert parse(reader.read_reply()) == [[b"s", [[b"667-0", [b"f", b"v"]]]]]


# ------------------------------------------------------ lag, entries-read


def _group(c: RespClient) -> dict:
    return _fields(parse(c.call("XINFO", "GROUPS", "s"))[0])


# ------------------------------------------------------------------ XSETID


# -------------------------------------------------------- XADD, XREAD texts


