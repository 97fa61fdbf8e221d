"""Stock redis-py clients (sync and asyncio, RESP2 and RESP3) against Partita's stream commands."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio


@pytest.mark.parametrize("protocol", [2, 3])
def test_redis_py_sync_stream_commands(partita_server, protocol):
    r = redis.Redis(host=partita_server.host, port=partita_server.port, protocol=protocol, socket_timeout=10)
    try:
        r.flushall()
        first = r.xadd("events", {"kind": "click", "n": 1})
        second = r.xadd("events", {"kind": b"\x00bin", "n": 2}, id="*")
        assert first < second or first.split(b"-")[0] <= second.split(b"-")[0]
        assert r.xlen("events") == 2
        assert r.xrange("events") == [(first, {b"kind": b"click", b"n": b"1"}),
                                      (second, {b"kind": b"\x00bin", b"n": b"2"})]
        assert r.xrevrange("events", count=1) == [(second, {b"kind": b"\x00bin", b"n": b"2"})]
        read = r.xread({"events": 0}, count=1)
        if protocol == 3:
            assert read == {b"events": [[(first, {b"kind": b"click", b"n": b"1"})]]}
        else:
            assert read == [[b"events", [(first, {b"kind": b"click", b"n": b"1"})]]]
        r.xadd("events", {"n": 3}, maxlen=2, approximate=False)
        assert r.xlen("events") == 2
        assert r.xdel("events", second) == 1
        assert r.xtrim("events", maxlen=0) == 1
        info = r.xinfo_stream("events")
        assert info["length"] == 0 and info["entries-added"] == 3
        assert info["max-deleted-entry-id"] == second
        assert r.exists("events") == 1 and r.type("events") == b"stream"
        assert r.keys("ev*") == [b"events"] and r.dbsize() == 1
        assert list(r.scan_iter(match="e*")) == [b"events"]
        with pytest.raises(redis.ResponseError, match="equal or smaller"):
            r.xadd("events", {"a": 1}, id="1-1")
        assert r.delete("events") == 1 and r.exists("events") == 0
    finally:
        r.close()


def test_redis_py_sync_blocking_read_wakes(partita_server):
    r = redis.Redis(host=partita_server.host, port=partita_server.port, socket_timeout=10)
    w = redis.Redis(host=partita_server.host, port=partita_server.port, socket_timeout=10)
    try:
        def later():
            time.sleep(0.2)
            w.xadd("jobs", {"job": "1"}, id="1-1")

        t = threading.Thread(target=later)
        t.start()
        started = time.monotonic()
        got = r.xread({"jobs": "$"}, block=5000)
        t.join()
        assert got == [[b"jobs", [(b"1-1", {b"job": b"1"})]]]
        assert time.monotonic() - started < 4
        assert r.xread({"jobs": "$"}, block=50) in ([], None)
    finally:
        r.close()
        w.close()


def test_redis_py_asyncio(partita_server):
    async def main():
        r = redis.asyncio.Redis(host=partita_server.host, port=partita_server.port, protocol=3)
        w = redis.asyncio.Redis(host=partita_server.host, port=partita_server.port)
        try:
            await r.flushall()
            reader = asyncio.create_task(r.xread({"q": "$"}, block=5000))
            await asyncio.sleep(0.1)
            ids = [await w.xadd("q", {"i": str(i)}) for i in range(3)]
            got = await reader
            assert list(got) == [b"q"] and got[b"q"][0][0][0] == ids[0]
            async with w.pipeline(transaction=True) as pipe:
                pipe.xadd("q", {"i": "3"}, id="*").xlen("q").xrange("q", count=2)
                _, length, head = await pipe.execute()
            assert length == 4 and [i for i, _ in head] == ids[:2]
            assert await w.xtrim("q", minid=ids[2]) == 0  # redis-py sends "~": one segment, kept
            assert await w.xtrim("q", minid=ids[2], approximate=False) == 2
            assert await w.xlen("q") == 2
        finally:
            await r.aclose()
            await w.aclose()

    asyncio.run(main())
