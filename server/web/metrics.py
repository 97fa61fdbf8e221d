"""``GET /metrics``: the node's state as Prometheus metrics.

Owns: every metric's name, type, help text and labels (docs/metrics.md lists
them), read at scrape time from what the server and the broker already
count: the broker's status (``cluster.broker.status.snapshot``: partitions,
groups, replication, the controller, fsync rounds) and the server's
statistics (``server.state.Stats``: commands, errors, latency histograms,
clients). Nothing is counted here, so a scrape costs the request path
nothing; the text is ``prometheus_client``'s own exposition (the classic
text format, or OpenMetrics when the scraper asks for it), with its
``process_*`` metrics beside Partita's.

Names follow Prometheus's conventions: ``partita_`` first, base units
(``_seconds``, ``_bytes``), ``_total`` on counters (the client adds it to a
counter family's name). Labels: ``topic``, ``partition``, ``group``,
``command``, ``code``, ``replica``, ``role``, ``policy``.

Must not know: HTTP, sockets, ACL rules (the caller passes which topics the
user may see), storage files.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

from cluster.broker.status import BrokerStatus, snapshot
from server.state import REDIS_VERSION, partita_version

PARTITION = ["topic", "partition"]
GROUP_PARTITION = ["topic", "partition", "group"]
CONTROLLER_ROLES = ("leader", "follower", "candidate", "precandidate")


def label(raw: bytes) -> str:
    """A topic, group or consumer name as a label value (binary-safe: bytes
    that are not UTF-8 appear as ``\\xNN``)."""
    return raw.decode("utf-8", "backslashreplace")


def exposition(state: Any, accept: bytes, may_see: Callable[[bytes], bool] | None = None) -> tuple[bytes, str]:
    """``(body, content type)`` of a scrape, in the format ``accept`` asks
    for (Prometheus's text format unless it asks for OpenMetrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PartitaCollector(state, may_see))
    ProcessCollector(registry=registry)
    encoder, content_type = choose_encoder(accept.decode("latin-1"))
    return encoder(registry), content_type


class PartitaCollector:
    """A ``prometheus_client`` collector reading the server at each scrape."""

    def __init__(self, state: Any, may_see: Callable[[bytes], bool] | None = None) -> None:
        self.state = state
        self.may_see = may_see

    def collect(self) -> Iterator[Any]:
        state = self.state
        status = snapshot(state.broker, self.may_see)
        yield from _node(state, status)
        yield from _commands(state.stats)
        yield from _partitions(status)
        yield from _groups(status)
        yield from _fsync(status)
        if status.cluster is not None:
            yield from _cluster(status)


def _node(state: Any, status: BrokerStatus) -> Iterator[Any]:
    info = InfoMetricFamily("partita_build", "Partita's version and the Redis version whose streams it matches.")
    info.add_metric([], {"version": partita_version(), "redis_version": REDIS_VERSION})
    yield info
    yield GaugeMetricFamily("partita_start_time_seconds", "When this server started (Unix time).",
                            value=state.started)
    yield GaugeMetricFamily("partita_connected_clients", "Clients connected on the client and TLS ports.",
                            value=len(state.clients))
    yield GaugeMetricFamily("partita_blocked_clients", "Clients waiting in XREAD / XREADGROUP BLOCK.",
                            value=state.blocked_clients)
    stats = state.stats
    yield CounterMetricFamily("partita_connections_received", "Client connections accepted.",
                              value=stats.total_connections_received)
    yield CounterMetricFamily("partita_connections_rejected", "Client connections refused (maxclients).",
                              value=stats.rejected_connections)
    yield CounterMetricFamily("partita_net_input_bytes", "Bytes received from clients.",
                              value=stats.total_net_input_bytes)
    yield CounterMetricFamily("partita_net_output_bytes", "Bytes sent to clients.",
                              value=stats.total_net_output_bytes)
    yield GaugeMetricFamily("partita_topics", "Topics this node knows (visible to the scraping user).",
                            value=len(status.topics))
    yield CounterMetricFamily("partita_entries_in", "Entries appended on this node, every partition.",
                              value=status.entries_in)
    yield CounterMetricFamily("partita_entries_out", "Entries served to readers by this node, every partition.",
                              value=status.entries_out)


def _commands(stats: Any) -> Iterator[Any]:
    calls = CounterMetricFamily("partita_commands", "Commands run, by command (INFO commandstats' calls).",
                                labels=["command"])
    failed = CounterMetricFamily("partita_command_failures",
                                 "Commands that ran and answered an error, by command (failed_calls).",
                                 labels=["command"])
    rejected = CounterMetricFamily("partita_command_rejections",
                                   "Commands refused before running (arity, auth, ACL, MULTI), by command "
                                   "(rejected_calls).", labels=["command"])
    for name, (n_calls, _usec, n_rejected, n_failed) in sorted(stats.commands.items()):
        calls.add_metric([name], n_calls)
        failed.add_metric([name], n_failed)
        rejected.add_metric([name], n_rejected)
    yield calls
    yield failed
    yield rejected
    errors = CounterMetricFamily("partita_error_replies", "Error replies sent, by error code (INFO errorstats).",
                                 labels=["code"])
    for code, count in sorted(stats.errors.items()):
        errors.add_metric([code], count)
    yield errors
    latency = HistogramMetricFamily(
        "partita_command_duration_seconds",
        "How long XADD and the reads (XREAD, XREADGROUP, XRANGE, XREVRANGE) ran on the server, replies "
        "answered at once (not the fsync or acks=all wait after, nor a BLOCK's wait).", labels=["command"])
    for name, hist in sorted(stats.latency.items()):
        latency.add_metric([name], _buckets(hist), hist.sum_us / 1e6)
    yield latency


def _buckets(hist: Any) -> list[tuple[str, int]]:
    return [(floatToGoString(bound), count) for bound, count in hist.cumulative()]


def _partitions(status: BrokerStatus) -> Iterator[Any]:
    families = {
        "log_start_offset": GaugeMetricFamily(
            "partita_partition_log_start_offset", "First offset still in the log (after retention and trims).",
            labels=PARTITION),
        "log_end_offset": GaugeMetricFamily(
            "partita_partition_log_end_offset", "Offset the next entry appended gets.", labels=PARTITION),
        "high_watermark": GaugeMetricFamily(
            "partita_partition_high_watermark", "Entries below this offset are on every in-sync replica "
            "(what readers see).", labels=PARTITION),
        "size_bytes": GaugeMetricFamily(
            "partita_partition_size_bytes", "Bytes of the partition's log segments on disk.", labels=PARTITION),
        "segments": GaugeMetricFamily(
            "partita_partition_segments", "Log segment files of the partition.", labels=PARTITION),
        "entries": GaugeMetricFamily(
            "partita_partition_entries", "Entries in the partition (XLEN: deleted and trimmed ones gone).",
            labels=PARTITION),
        "entries_added": CounterMetricFamily(
            "partita_partition_entries_appended", "Entries ever appended to the partition (Redis's entries-added).",
            labels=PARTITION),
    }
    leader = GaugeMetricFamily("partita_partition_leader",
                               "1 where this node leads the partition (serves its writes), else 0.", labels=PARTITION)
    isr = GaugeMetricFamily("partita_partition_isr_size",
                            "In-sync replicas of the partition, the leader included (reported by its leader).",
                            labels=PARTITION)
    replicas = GaugeMetricFamily("partita_partition_replicas", "Replicas of the partition (its leader reports it).",
                                 labels=PARTITION)
    lag = GaugeMetricFamily("partita_partition_replica_lag_entries",
                            "Entries a follower is behind the leader's log end (reported by the leader).",
                            labels=PARTITION + ["replica"])
    for p in status.partitions:
        labels = [label(p.topic), str(p.partition)]
        if p.held:
            for field, family in families.items():
                family.add_metric(labels, getattr(p, field))
            leader.add_metric(labels, 1 if p.leading else 0)
        if p.leading:
            isr.add_metric(labels, len(p.isr) if p.isr else 1)
            replicas.add_metric(labels, len(p.replicas) if p.replicas else 1)
            for replica, behind in p.replica_lag:
                lag.add_metric(labels + [str(replica)], behind)
    yield from families.values()
    yield leader
    yield isr
    yield replicas
    yield lag


def _groups(status: BrokerStatus) -> Iterator[Any]:
    lag = GaugeMetricFamily("partita_group_lag_entries",
                            "Entries of the partition the group has not yet been delivered (XINFO GROUPS' lag; "
                            "absent when Redis's rules cannot tell).", labels=GROUP_PARTITION)
    pending = GaugeMetricFamily("partita_group_pending_entries",
                                "Entries delivered to the group and not yet acknowledged (its PEL).",
                                labels=GROUP_PARTITION)
    consumers = GaugeMetricFamily("partita_group_consumers", "Consumers the group has on the partition.",
                                  labels=GROUP_PARTITION)
    read = GaugeMetricFamily("partita_group_entries_read",
                             "The group's consumer offset on the partition (XINFO GROUPS' entries-read).",
                             labels=GROUP_PARTITION)
    members = GaugeMetricFamily("partita_group_members",
                                "Live members of a group reading the whole topic (XREADGROUP on the topic key).",
                                labels=["topic", "group"])
    partitions = {(p.topic, p.partition): p for p in status.partitions}
    for g in status.groups:
        part = partitions.get((g.topic, g.partition))
        if part is not None and not part.leading:
            continue  # the leader reports it (a follower's copy would count it twice)
        labels = [label(g.topic), str(g.partition), label(g.group)]
        if g.lag is not None:
            lag.add_metric(labels, g.lag)
        if g.entries_read is not None:
            read.add_metric(labels, g.entries_read)
        pending.add_metric(labels, g.pending)
        consumers.add_metric(labels, len(g.consumers))
    live: dict[tuple[bytes, bytes], int] = {}
    for m in status.members:
        live[(m.topic, m.group)] = live.get((m.topic, m.group), 0) + (1 if m.alive else 0)
    for (topic, group), count in sorted(live.items()):
        members.add_metric([label(topic), label(group)], count)
    yield lag
    yield pending
    yield consumers
    yield read
    yield members


def _fsync(status: BrokerStatus) -> Iterator[Any]:
    rounds = HistogramMetricFamily(
        "partita_fsync_round_duration_seconds",
        "Flush rounds that fsynced the logs and group journals written: under fsync always one group-commit "
        "round for many writers, under everysec one a second (its _count is the rounds).", labels=["policy"])
    for policy, hist in sorted(status.fsync_rounds.items()):
        rounds.add_metric([policy], _buckets(hist), hist.sum_us / 1e6)
    yield rounds


def _cluster(status: BrokerStatus) -> Iterator[Any]:
    c = status.cluster
    yield GaugeMetricFamily("partita_cluster_node_id", "This node's id (node-id).", value=c.node_id)
    yield GaugeMetricFamily("partita_cluster_nodes", "Nodes in the cluster.", value=len(c.nodes))
    yield GaugeMetricFamily("partita_cluster_fenced_nodes",
                            "Nodes the controller fenced (no heartbeat: they lead nothing).",
                            value=sum(1 for n in c.nodes if n.fenced))
    role = GaugeMetricFamily("partita_controller_role",
                             "1 for this node's role in the controller quorum (Raft), 0 for the others.",
                             labels=["role"])
    for name in CONTROLLER_ROLES:
        role.add_metric([name], 1 if c.controller_role == name else 0)
    yield role
    yield GaugeMetricFamily("partita_controller_leader", "Node id of the controller's leader (-1: none known).",
                            value=c.controller_leader if c.controller_leader is not None else -1)
    yield GaugeMetricFamily("partita_controller_term", "The controller quorum's Raft term.", value=c.controller_term)
    yield CounterMetricFamily("partita_controller_elections_won", "Controller elections this node won.",
                              value=c.elections_won)
    yield CounterMetricFamily("partita_leader_changes",
                              "Shard leader changes (a new leader or epoch) this node applied since it started.",
                              value=c.leader_changes)
    yield GaugeMetricFamily("partita_shards_led", "Shards (hash-slot ranges) this node leads.",
                            value=sum(1 for s in c.shards if s.leader == c.node_id))
