"""The cluster bus end to end, real processes on loopback (issue 28): peers
talk on a port of their own, the client port knows no internal command, and
no message from anyone moves leadership or an epoch past what the
controller committed."""

from __future__ import annotations


import pytest
import redis

from cluster.controller.raft import APPEND, Message

from tests.clusterkit import Cluster, eventually as _eventually, key_in_shard, partition_lines, running
from tests.conftest import RawConn, read_until_closed

FORGED_VIEW = b"2:999999999,2:1,3:1"  # shard 0 "led" by node 2 at a huge epoch


def _info(node) -> dict:
    return node.client(socket_timeout=5).execute_command("INFO", "replication")


def _committed(node, shard: int) -> dict:
    raw = _info(node)[f"controller_shard{shard}"]
    text = raw if isinstance(raw, str) else ",".join(f"{k}={v}" for k, v in raw.items())
    return dict(item.split("=", 1) for item in text.split(","))


def _resp(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def _call(port: int, *args: bytes):
    """One command's reply, parsed as it came (no client library's reshaping)."""
    import hiredis

    with RawConn(port) as conn:
        reader = hiredis.Reader()
        reader.feed(conn.request(_resp(*args)))
        return reader.gets()


@pytest.fixture
def cluster(tmp_path):
    yield from running(tmp_path, extra=["--leader-rebalance-delay-ms", "-1"])


def test_a_forged_view_moves_no_leadership_and_loses_no_acknowledged_entry(cluster):
    node1, node2, _node3 = cluster.nodes
    key = key_in_shard(cluster, 0, "forged")
    assert cluster.leader_of(key) is node1
    client = node1.client()
    acked = [client.xadd(key, {"n": i}) for i in range(29)]  # acks=all: on every ISR replica
    epoch = int(_committed(node1, 0)["epoch"])
    # The attack of issue 28, on the client port of two nodes.
    for node in (node1, node2):
        with RawConn(node.port) as conn:
            reply = conn.request(_resp(b"REPLVIEW", FORGED_VIEW))
        assert reply == (b"-ERR unknown command 'REPLVIEW', with args beginning with: "
                         b"'2:999999999,2:1,3:1' \r\n"), reply
    for node in cluster.nodes:  # every node still has node 1 leading shard 0, at the committed epoch
        assert cluster.leader_of(key) is node1
        assert partition_lines(node)[key.decode()]["epoch"] == str(epoch), partition_lines(node)
        assert int(_committed(node, 0)["epoch"]) == epoch
    # Without a cluster-secret the bus is open to whoever reaches it: the
    # same view in a fetch (a peer's view travels with each one), and a
    # record taking the shard to that epoch proposed to the controller,
    # move nothing either.
    for node in (node1, node2):
        with RawConn(node.bus_port) as conn:  # (no peer sends it: the bus closes the connection)
            assert conn.request(_resp(b"REPLVIEW", FORGED_VIEW)).startswith(b"-ERR unknown command 'REPLVIEW'")
        with RawConn(node.bus_port) as conn:
            served = conn.request(_resp(b"REPLFETCH", b"3", FORGED_VIEW, b"1", b"1024", b""))
            assert served.startswith(b"*4\r\n"), served
    leader_id = int(_info(node1)["controller_leader"])
    controller = cluster.nodes[leader_id - 1]
    version = int(_committed(controller, 0)["version"])
    applied = int(_info(controller)["controller_applied"])
    record = b'{"epoch":999999999,"expect":%d,"isr":[1,2,3],"leader":2,"s":0,"t":"shard"}' % version
    with RawConn(controller.bus_port) as conn:
        assert conn.request(_resp(b"CTRLPROPOSE", record)) == b"+OK\r\n"  # proposed, committed ...
    _eventually(lambda: int(_info(controller)["controller_applied"]) > applied, what="the record applied")
    for node in cluster.nodes:  # ... and applied as nothing
        assert cluster.leader_of(key) is node1
        assert partition_lines(node)[key.decode()]["epoch"] == str(epoch)
        assert _committed(node, 0)["epoch"] == str(epoch) and _committed(node, 0)["version"] == str(version)
    _eventually(lambda: "ignoring node 3's view of the cluster, node 2 leading shard 0 at epoch 999999999"
                in node1.log(), what="the forged view logged")
    cluster.wait_converged(key.decode())
    assert [entry_id for entry_id, _ in client.xrange(key)] == acked
    # The controller stays in charge: a manual failover commits node 2 at the next epoch.
    assert node2.client().execute_command("CLUSTER", "FAILOVER") == b"OK"
    _eventually(lambda: all(int(_committed(n, 0)["epoch"]) == epoch + 1 for n in cluster.nodes),
                what="the failover committed everywhere")
    assert cluster.leader_of(key) is node2
    fresh = node2.client()
    acked.append(fresh.xadd(key, {"n": "after"}))
    cluster.wait_converged(key.decode())
    assert [entry_id for entry_id, _ in fresh.xrange(key)] == acked
    assert len({cluster.log_bytes(node, key.decode()) for node in cluster.nodes}) == 1
    for node in cluster.nodes:
        assert partition_lines(node)[key.decode()]["epoch"] == str(epoch + 1)


INTERNAL = [  # every internal command, with arguments a peer would send
    [b"REPLAUTH", b"s3cret"],
    [b"REPLFETCH", b"2", b"1:1,2:1,3:1", b"100", b"1048576", b""],
    [b"REPLEPOCH", b"orders", b"0", b"1"],
    [b"REPLPAUSE", b"0", b"1", b"15000"],
    [b"REPLVIEW", FORGED_VIEW],
    [b"RAFT", b"garbage"],
    [b"CTRLBEAT", b"1", b"abcdef"],
    [b"CTRLPROPOSE", b'{"t":"shard"}'],
    [b"CTRLJOIN", b"4", b"127.0.0.1", b"7004", b"17004"],
    [b"CTRLMOVE", b"0"],
    [b"REPLREAD", b"0", b"orders", b"1", b"range", b"0-0", b"9-9", b"10"],
    [b"GROUPREAD", b"orders", b"1", b"g", b"c", b"new", b"10", b"0", b"-1", b"0-0", b"0", b""],
    [b"GROUPINFO", b"orders", b"1", b"0", b"", b"0"],
]


def test_the_client_port_answers_internal_commands_as_redis_answers_unknown_ones(cluster, redis_server):
    node = cluster.nodes[0]
    payload = b"".join(_resp(*argv) for argv in INTERNAL)
    with RawConn(node.port) as ours, RawConn(redis_server.port) as theirs:
        assert ours.request(payload, len(INTERNAL)) == theirs.request(payload, len(INTERNAL))
    with RawConn(node.port) as conn:  # e.g. -ERR unknown command 'REPLVIEW', with args beginning with: '2:...'
        assert conn.request(_resp(b"replview", FORGED_VIEW)) == (
            b"-ERR unknown command 'replview', with args beginning with: '2:999999999,2:1,3:1' \r\n")
    names = {name.decode() for name in _call(node.port, b"COMMAND", b"LIST")}
    assert "xadd" in names and "cluster" in names
    internal = sorted(argv[0].lower() for argv in INTERNAL)
    assert not names & {name.decode() for name in internal}
    assert _call(node.port, b"COMMAND", b"INFO", *internal) == [None] * len(internal)
    assert _call(node.port, b"COMMAND", b"COUNT") == len({name for name in names if "|" not in name})
    assert cluster.leader_of(b"x") is cluster.leader_of(b"x")  # nothing moved, the cluster still answers


def test_the_bus_serves_the_peers_commands_only(cluster):
    """What no peer sends (a client's command, garbage, HTTP, a request
    that does not decode or has the wrong arity, a fetch from a node that
    is no member) gets its error, then the connection closes and the node
    logs it; the node serves its clients and replicates on, and no
    acknowledged entry moves."""
    key = key_in_shard(cluster, 0, "stranger")
    node = cluster.leader_of(key)
    me = cluster.nodes.index(node) + 1
    term = int(_info(node)["controller_term"])
    client = node.client()
    acked = [client.xadd(key, {"n": i}) for i in range(5)]
    with RawConn(node.bus_port) as conn:  # what a peer may send keeps the connection
        assert conn.request(b"PING\r\n") == b"+PONG\r\n"
        assert conn.request(b"REPLAUTH x\r\n").startswith(b"-ERR REPLAUTH called without a cluster-secret")
        assert conn.request(b"PING\r\n") == b"+PONG\r\n"
    strangers = [
        (b"REPLFETCH x y 10 10 tok\r\n", b"-ERR malformed REPLFETCH"), (b"REPLEPOCH a b c\r\n", b"-ERR malformed"),
        (b"RAFT garbage\r\n", b"-ERR malformed RAFT"), (b"CTRLPROPOSE {}\r\n", b"-ERR malformed CTRLPROPOSE"),
        (b"CTRLBEAT x y\r\n", b"-ERR malformed CTRLBEAT"), (b"CTRLBEAT 1 y 0,zz\r\n", b"-ERR malformed CTRLBEAT"),
        (b"CTRLBEAT 1 y 99999\r\n", b"-ERR malformed CTRLBEAT"),
        (b"REPLREAD 0 t 1 drop 0-0 0-0 0\r\n", b"-ERR malformed REPLREAD"),
        (b"GROUPREAD t 1 g c drop 0 0 -1 0-0 0 x\r\n", b"-ERR malformed GROUPREAD"),
        (b"GROUPINFO t yes 0 g 1\r\n", b"-ERR malformed GROUPINFO"),
        (_resp(b"REPLFETCH", b"99", b"", b"0", b"1024", b""),
         b"-ERR malformed REPLFETCH request: node 99 is not another member of this cluster"),
        (b"CTRLBEAT 1 y 0 1\r\n", b"-ERR wrong number of arguments for 'ctrlbeat' command"),
        # A member's Raft message at the u64 term's end: adopted, it made every node stop, unable to
        # encode its next message (the term a stranger can move by TERM_JUMP_MAX at most, not to the end).
        (_resp(b"RAFT", Message(APPEND, me % 3 + 1, me, 2**64 - 1).encode()),
         b"-ERR malformed RAFT request: term 18446744073709551615 of node %d's append is more than" % (me % 3 + 1)),
        (bytes(range(1, 256)), b"-ERR unknown command"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"-ERR unknown command 'GET'"),
        (b"*2\r\n$4\r\nPING\r\n$4000000000\r\n", b"-ERR Protocol error: invalid bulk length"),
    ] + [(c + b"\r\n", b"-ERR unknown command '" + c.split()[0] + b"'")
         for c in (b"GET k", b"XRANGE k - +", b"CLUSTER SLOTS", b"CONFIG GET *", b"FLUSHALL")]
    for payload, error in strangers:
        with RawConn(node.bus_port) as conn:
            conn.sock.sendall(payload)
            assert read_until_closed(conn.sock).startswith(error), payload
    assert "cluster bus: closing the connection from 127.0.0.1:" in node.log()
    assert "cluster bus: protocol error from 127.0.0.1:" in node.log()
    acked += [client.xadd(key, {"n": i}) for i in range(5, 10)]  # acks=all: the followers fetch on
    assert cluster.leader_of(key) is node
    assert {int(_info(each)["controller_term"]) for each in cluster.nodes} == {term}
    assert [entry_id for entry_id, _ in client.xrange(key)] == acked
    cluster.wait_converged(key.decode())
    assert len({cluster.log_bytes(each, key.decode()) for each in cluster.nodes}) == 1
    node = cluster.nodes[0]
    # Peers are not clients: no CLIENT LIST entry (the nodes keep links to each other's bus).
    listed = node.client().execute_command("CLIENT", "LIST").decode()
    assert f"laddr=127.0.0.1:{node.bus_port}" not in listed and f":{node.port}" in listed
    assert "is unauthenticated" in node.log()  # the start-up warning: no cluster-secret
    assert f"Cluster bus listening on 127.0.0.1:{node.bus_port}" in node.log()
    # The start-up log names this node and its peers (node 1 here).
    assert ("Cluster node 1; peers: " + ", ".join(
        f"node {i + 1} at 127.0.0.1:{n.port} (bus {n.bus_port})" for i, n in enumerate(cluster.nodes)
        if n is not node)) in node.log()
    nodes = node.client().execute_command("CLUSTER", "NODES").decode()
    assert f"127.0.0.1:{node.port}@{node.bus_port} myself,master" in nodes


def test_the_idle_timeout_closes_clients_never_peers(cluster):
    """Redis closes clients idle past ``timeout``; its cluster bus is not a
    client. A bus connection idle for longer than a client the timeout
    closed is still served."""
    node = cluster.nodes[0]
    with RawConn(node.bus_port) as peer:
        assert peer.request(b"PING\r\n") == b"+PONG\r\n"
        with RawConn(node.port, timeout_s=10) as client:  # idle from after the peer's last request
            assert client.request(b"PING\r\n") == b"+PONG\r\n"
            assert _call(node.port, b"CONFIG", b"SET", b"timeout", b"1") == b"OK"
            assert read_until_closed(client.sock) == b""  # the sweep that closed it saw the peer idle longer
        assert peer.request(b"PING\r\n") == b"+PONG\r\n"
    assert _call(node.port, b"CONFIG", b"SET", b"timeout", b"0") == b"OK"


SECRET = "bus-s3cret-value"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    yield from running(tmp_path_factory.mktemp("secured"), extra=["--cluster-secret", SECRET])


def test_with_a_secret_the_bus_runs_nothing_before_the_peer_presents_it(secured):
    key = b"guarded"
    # The preferred leaders, so that nothing moves during the test (a node that
    # started late takes its shard back after the rebalance delay).
    secured.wait_leading()
    leader = secured.leader_of(key)
    leader.client().xadd(key, {"a": "1"})
    secured.wait_converged("guarded")  # the nodes fetch from each other with the secret
    epoch = partition_lines(leader)["guarded"]["epoch"]
    for node in secured.nodes:
        with RawConn(node.bus_port) as conn:
            for payload in (b"PING\r\n", _resp(b"REPLFETCH", b"3", FORGED_VIEW, b"1", b"1024", b""),
                            _resp(b"CTRLBEAT", b"1", b"x"), _resp(b"RAFT", b"x"),
                            _resp(b"XADD", key, b"*", b"a", b"2")):
                assert conn.request(payload) == b"-NOAUTH Authentication required.\r\n", payload
            assert conn.request(_resp(b"REPLAUTH", b"wrong")) == b"-NOPERM invalid cluster secret\r\n"
            assert conn.request(b"PING\r\n") == b"-NOAUTH Authentication required.\r\n"
            assert conn.request(_resp(b"REPLAUTH", SECRET.encode())) == b"+OK\r\n"
            assert conn.request(b"PING\r\n") == b"+PONG\r\n"
        assert "presented a wrong cluster-secret" in node.log()
        assert "is unauthenticated" not in node.log()
    assert secured.leader_of(key) is leader and partition_lines(leader)["guarded"]["epoch"] == epoch
    assert [f[b"a"] for _, f in leader.client().xrange(key)] == [b"1"]  # the refused XADD wrote nothing


def test_the_secret_is_in_no_log_info_or_client_list_but_config_get_has_it(secured):
    node = secured.nodes[0]
    with RawConn(node.bus_port) as conn:  # a peer's wrong and right secrets, on record nowhere
        conn.request(_resp(b"REPLAUTH", SECRET.encode() + b"-typo"))
        conn.request(_resp(b"REPLAUTH", SECRET.encode()))
    with RawConn(node.port) as conn:  # sent to the client port by mistake: unknown there
        assert conn.request(_resp(b"REPLAUTH", SECRET.encode())).startswith(b"-ERR unknown command 'REPLAUTH'")
    client = node.client()
    seen = [repr(client.info("everything")), client.execute_command("CLIENT", "LIST").decode(),
            client.execute_command("CLIENT", "INFO").decode()]
    seen += [n.log_path.read_text(errors="replace") for n in secured.nodes]
    assert not [text[:200] for text in seen if SECRET in text]
    # CONFIG GET answers it to a client allowed to run CONFIG, as Redis does requirepass and masterauth.
    assert client.config_get("cluster-secret") == {"cluster-secret": SECRET}


def test_a_link_refused_by_a_port_that_echoes_the_request_logs_the_secret_redacted(tmp_path):
    """Node 2 is told node 1's bus is node 1's client port (a misconfigured
    cluster-nodes): REPLAUTH is unknown there, and the error quotes what was
    sent. Node 2 logs the refusal with the secret replaced by (redacted)."""
    from tests.clusterkit import listen_ports
    from tests.conftest import PartitaProcess

    p1, b1, p2, b2 = listen_ports(4)
    # Node 1 listens on the bus port cluster-port names (its entry names none).
    specs = [f"1@127.0.0.1:{p1},2@127.0.0.1:{p2}@{b2}", f"1@127.0.0.1:{p1}@{p1},2@127.0.0.1:{p2}@{b2}"]
    nodes = []
    try:
        for i, (port, spec) in enumerate(zip((p1, p2), specs)):
            node = PartitaProcess(tmp_path / f"node{i + 1}", ["--node-id", str(i + 1), "--cluster-nodes", spec,
                                                             "--cluster-secret", SECRET, "--cluster-port",
                                                             str((b1, 0)[i])])
            node.port = port
            nodes.append(node.start())
        assert f"Cluster bus listening on 127.0.0.1:{b1} (peers present cluster-secret)" in nodes[0].log()
        assert f"Cluster bus listening on 127.0.0.1:{b2} " in nodes[1].log()
        assert nodes[0].client().config_get("cluster-port") == {"cluster-port": str(b1)}
        assert nodes[1].client().config_get("cluster-port") == {"cluster-port": "0"}
        _eventually(lambda: f"REPLAUTH to 127.0.0.1:{p1} refused: ERR unknown command 'REPLAUTH', "
                            "with args beginning with: '(redacted)'" in nodes[1].log(),
                    what="the refused link logged")
        assert SECRET not in nodes[1].log() and SECRET not in nodes[0].log()
    finally:
        for node in nodes:
            node.stop()


def test_requirepass_is_in_no_log_info_or_client_list(partita_factory):
    server = partita_factory(["--requirepass", "client-pw-value"])
    client = server.client(password="client-pw-value")
    client.xadd("k", {"a": "1"})
    with pytest.raises(redis.AuthenticationError):
        server.client(password="wrong-pw-value").ping()
    seen = [repr(client.info("everything")), client.execute_command("CLIENT", "LIST").decode(), server.log()]
    assert not [text[:200] for text in seen if "client-pw-value" in text or "wrong-pw-value" in text]
    assert client.config_get("requirepass") == {"requirepass": "client-pw-value"}  # as redis-server
