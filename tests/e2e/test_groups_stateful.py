"""Random consumer-group operations against Partita and redis-server at once
(hypothesis stateful test, modest budget): every reply must be identical.

Only time-independent commands are compared byte for byte (no idle times):
min-idle-time is always 0, XPENDING is the summary form.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from tests.e2e.groups_support import Pair

pytestmark = pytest.mark.redis

KEYS = ["s1", "s2"]
GROUPS = ["g1", "g2"]
CONSUMERS = ["alice", "bob", "carol"]
ids = st.integers(0, 40).map(lambda n: f"{n}-0")


@pytest.fixture
def servers(partita_shared, redis_server):
    return partita_shared.port, redis_server.port


def test_random_group_operations_match_redis(servers):
    partita_port, redis_port = servers

    class GroupMachine(RuleBasedStateMachine):
        @initialize(protocol=st.sampled_from([2, 3]))
        def connect(self, protocol):
            self.pair = Pair(partita_port, redis_port, protocol)
            self.next_ms = {k: 1 for k in KEYS}

        def teardown(self):
            if hasattr(self, "pair"):
                self.pair.close()

        @rule(key=st.sampled_from(KEYS), n=st.integers(1, 3))
        def xadd(self, key, n):
            for _ in range(n):
                self.pair.same("XADD", key, f"{self.next_ms[key]}-0", "f", str(self.next_ms[key]))
                self.next_ms[key] += 1

        @rule(key=st.sampled_from(KEYS), victims=st.lists(ids, min_size=1, max_size=3))
        def xdel(self, key, victims):
            self.pair.same("XDEL", key, *victims)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS),
              start=st.one_of(st.just("$"), ids), mk=st.booleans())
        def create(self, key, group, start, mk):
            self.pair.same("XGROUP", "CREATE", key, group, start, *(["MKSTREAM"] if mk else []))

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS))
        def destroy(self, key, group):
            self.pair.same("XGROUP", "DESTROY", key, group)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS), start=st.one_of(st.just("$"), ids),
              entries_read=st.one_of(st.none(), st.integers(-1, 10)))
        def setid(self, key, group, start, entries_read):
            if entries_read is not None:
                # Redis 8.2.2+ takes an ENTRIESREAD above entries-added as
                # entries-added (test_streams_redis8_core.py); the 7.0
                # reference is given what 8 would store.
                info = self.pair.redis.value("XINFO", "STREAM", key)
                if not isinstance(info, Exception):
                    info = info if isinstance(info, dict) else dict(zip(info[::2], info[1::2]))
                    entries_read = min(entries_read, info[b"entries-added"])
            extra = [] if entries_read is None else ["ENTRIESREAD", str(entries_read)]
            self.pair.same("XGROUP", "SETID", key, group, start, *extra)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS), consumer=st.sampled_from(CONSUMERS),
              create=st.booleans())
        def consumer(self, key, group, consumer, create):
            self.pair.same("XGROUP", "CREATECONSUMER" if create else "DELCONSUMER", key, group, consumer)

        @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True),
              group=st.sampled_from(GROUPS), consumer=st.sampled_from(CONSUMERS),
              count=st.integers(0, 4), noack=st.booleans(), history=st.one_of(st.none(), ids))
        def readgroup(self, keys, group, consumer, count, noack, history):
            args = ["XREADGROUP", "GROUP", group, consumer, "COUNT", str(count)]
            if noack:
                args.append("NOACK")
            reply = self.pair.same(*args, "STREAMS", *keys, *([history or ">"] * len(keys)))
            if not reply.startswith(b"-"):
                # Redis 7.2+ creates the consumer even when it serves a key
                # nothing; the 7.0 reference is brought to that state.
                for key in keys:
                    self.pair.redis.call("XGROUP", "CREATECONSUMER", key, group, consumer)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS), acks=st.lists(ids, min_size=1, max_size=4))
        def ack(self, key, group, acks):
            self.pair.same("XACK", key, group, *acks)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS), consumer=st.sampled_from(CONSUMERS),
              claims=st.lists(ids, min_size=1, max_size=3), justid=st.booleans(), force=st.booleans(),
              retry=st.one_of(st.none(), st.integers(0, 5)))
        def claim(self, key, group, consumer, claims, justid, force, retry):
            args = ["XCLAIM", key, group, consumer, "0", *claims]
            if justid:
                args.append("JUSTID")
            if force:
                args.append("FORCE")
            if retry is not None:
                args += ["RETRYCOUNT", str(retry)]
            self.pair.same(*args)

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS), consumer=st.sampled_from(CONSUMERS),
              start=ids, count=st.integers(1, 4), justid=st.booleans())
        def autoclaim(self, key, group, consumer, start, count, justid):
            self.pair.same("XAUTOCLAIM", key, group, consumer, "0", start, "COUNT", str(count),
                           *(["JUSTID"] if justid else []))

        @rule(key=st.sampled_from(KEYS), group=st.sampled_from(GROUPS))
        def inspect(self, key, group):
            self.pair.same("XPENDING", key, group)
            mine, theirs = self.pair.both("XINFO", "GROUPS", key)
            if self.pair.redis.value("XLEN", key) == 0:
                # Redis 7.4+: every group of an empty stream lags by 0 (7.0
                # may say nil or count entries since deleted).
                theirs = re.sub(rb"\$3\r\nlag\r\n(?:_|\$-1|:-?\d+)\r\n", b"$3\r\nlag\r\n:0\r\n", theirs)
            assert mine == theirs, f"XINFO GROUPS {key}\n partita: {mine!r}\n redis:   {theirs!r}"

    GroupMachine.TestCase.settings = settings(
        max_examples=20, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    GroupMachine.TestCase().runTest()
