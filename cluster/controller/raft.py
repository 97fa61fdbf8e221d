"""The Raft consensus core of the controller quorum, free of I/O.

Owns: one node's Raft state (term, vote, log, commit index, role) and the
rules that move it: leader election with pre-vote and leader stickiness,
check quorum, log replication with conflict repair, commitment, learners,
snapshots (compaction and install) and leadership transfer. It follows
etcd raft's shape: the caller feeds it ``tick()`` (a logical clock),
``step(message)`` (a peer's message) and ``propose(data)``; everything the
node wants done comes out of ``ready()``, which the caller carries out in
this order:

1. persist ``ready.hard_state``, ``ready.snapshot`` and ``ready.entries``
   (``RaftStore.save``) and wait for them to be durable;
2. send ``ready.messages``;
3. restore the state machine from ``ready.snapshot.data`` if there is one,
   then apply ``ready.committed`` in order.

A node's driver, in outline (the store is ``raft_store.RaftStore``)::

    hs, snap, entries = store.load()
    node = Raft(my_id, voters, learners, hard_state=hs, snapshot=snap, entries=entries)
    app.restore(snap.data if snap else None)
    loop: node.tick() every tick; node.step(Message.decode(blob)) per message;
          node.propose(data) on the leader; then while node.has_ready():
              rd = node.ready()
              store.save(rd)                      # durable first
              for m in rd.messages: send(m.dst, m.encode())
              if rd.snapshot: app.restore(rd.snapshot.data)
              for e in rd.committed: app.apply(e) # e.data == b"": a leader's no-op
    now and then: node.compact(node.applied_index, app.snapshot());
                  store.save_snapshot(node.snapshot)

Rules kept here (Raft paper §5, Ongaro's thesis §9.6, §6.4.1 and §3.10):

- election timeout drawn from ``[election_ticks, 2 * election_ticks)``;
  a leader sends heartbeats (empty APPENDs) every ``heartbeat_ticks``;
- pre-vote: a node first asks whether it could win in ``term + 1`` without
  changing anybody's term, and campaigns only with a majority of yeses;
- leader stickiness: a node that heard from a leader within
  ``election_ticks`` ignores (pre-)vote requests of higher terms (except a
  leadership transfer's), so a node coming back from isolation cannot
  depose a working leader;
- check quorum: every ``election_ticks`` a leader that has not heard from a
  majority of voters since the previous check steps down;
- a message of a higher term makes the node a follower in that term, except
  pre-vote requests (never) and granted pre-vote answers (the campaign then
  bumps the term itself);
- a node votes at most once per term; term and vote only move forward;
- a leader appends a no-op entry (``data == b""``) when its term starts and
  commits only entries of its own term by a majority of voters (§5.4.2);
  followers commit ``min(leader commit, last entry the APPEND proved)``;
- learners receive the log and the commit index, never vote, never count
  in a quorum and never campaign;
- a node whose stored log lost records to damage (``lost_log_end``: the
  last ``(term, index)`` its log may have held, and acknowledged) may have
  been the voter that made a lost entry committed, so, while its log is
  behind that point and the voters are an odd number of at least three: it
  grants a (pre-)vote only to a candidate whose log reaches that point, and
  its own vote does not count when it campaigns (it needs a quorum of the
  others). With an even number of voters every election quorum shares a
  node other than it with every commit quorum, so nothing changes; with one
  voter nothing lost can be had back. A leader's entries end it;
- messages from nodes outside ``voters + learners`` are ignored; an APPEND
  or SNAPSHOT of an older term is answered with this node's term so the
  stale leader steps down; a SNAPSHOT not answered within
  ``election_ticks`` is sent again.

Learners can join a running cluster: ``add_learner(id)`` on every node
(followers too, so any later leader replicates to it) makes the node a
member; the leader starts probing it from its last index + 1 with the next
heartbeat and falls back to a SNAPSHOT if the entries it needs are
compacted. The new node itself is a ``Raft`` built with the cluster's
voters and ``learners=[itself]``; with an empty log and term 0 it takes
the leader's term from the first APPEND or SNAPSHOT and catches up from
there. Adding a learner changes no quorum, so it needs no joint consensus;
the caller decides (e.g. through a committed entry of its own state
machine) which nodes call ``add_learner`` and passes the membership again
on restart, since raft does not persist it.

Must not know: sockets, trio, time, disks, threads, what the entries mean.
Randomness comes only from the injected ``random.Random``. Changing the
voters (adding, removing or promoting a learner) is not implemented, nor is
removing a learner: ``voters`` are fixed for the life of the object and
``learners`` only grow.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

# Message kinds.
PREVOTE = "prevote"
PREVOTE_RESP = "prevote_resp"
VOTE = "vote"
VOTE_RESP = "vote_resp"
APPEND = "append"
APPEND_RESP = "append_resp"
SNAPSHOT = "snapshot"
SNAPSHOT_RESP = "snapshot_resp"
TIMEOUT_NOW = "timeout_now"  # leadership transfer: campaign now, skipping pre-vote

KINDS = (PREVOTE, PREVOTE_RESP, VOTE, VOTE_RESP, APPEND, APPEND_RESP, SNAPSHOT, SNAPSHOT_RESP, TIMEOUT_NOW)

# A message whose term is further ahead of this node's than this is dropped:
# no run of elections gets a peer there (pre-vote keeps a cut-off node's term
# from rising), so it is forged, and adopting it would let one message run
# the term into the end of its u64 encoding (every node then failed to
# encode its next message and stopped).
TERM_JUMP_MAX = 1 << 20

# Roles.
FOLLOWER = "follower"
PRECANDIDATE = "precandidate"
CANDIDATE = "candidate"
LEADER = "leader"

# A follower's replication state as the leader tracks it (etcd tracker/progress.go).
PROBE = "probe"  # one APPEND per heartbeat until one is accepted
REPLICATE = "replicate"  # APPENDs sent optimistically as entries are proposed
SNAPSHOTTING = "snapshot"  # a SNAPSHOT is on its way; nothing else is sent


@dataclass(frozen=True)
class Entry:
    term: int
    index: int
    data: bytes  # b"" = the no-op entry a new leader appends at the start of its term


@dataclass(frozen=True)
class HardState:
    """What must be on disk before any message that depends on it is sent."""

    term: int
    vote: int | None  # node id voted for in ``term``, None if none
    commit: int


@dataclass(frozen=True)
class Snapshot:
    index: int  # last log index the snapshot covers
    term: int  # term of that entry
    data: bytes  # the application's state machine bytes (opaque to raft)


# ---------------------------------------------------------------- messages

_KIND_CODE = {k: i + 1 for i, k in enumerate(KINDS)}
_CODE_KIND = {i: k for k, i in _KIND_CODE.items()}
_FLAG_REJECT = 1
_FLAG_TRANSFER = 2
_FLAG_SNAPSHOT = 4
_FORMAT_VERSION = 1
# version, kind, flags, src, dst, term, log_term, index, commit, hint, number of entries
_HEAD = struct.Struct("<BBBQQQQQQQI")
_ENTRY = struct.Struct("<QQI")  # term, index, len(data); then data
_SNAP = struct.Struct("<QQI")  # index, term, len(data); then data


def _take(view: memoryview, pos: int, head: struct.Struct, what: str) -> tuple[tuple[int, int], bytes, int]:
    """One ``head`` (two numbers and a length) and the data after it: ``(numbers, data, next pos)``."""
    if pos + head.size > len(view):
        raise ValueError(f"raft message: truncated {what}")
    a, b, n = head.unpack_from(view, pos)
    pos += head.size
    if pos + n > len(view):
        raise ValueError(f"raft message: truncated {what} data")
    return (a, b), bytes(view[pos:pos + n]), pos + n


@dataclass
class Message:
    """One Raft message. Fields a kind does not use stay at their defaults.

    - PREVOTE / VOTE: ``term`` is the term the sender campaigns in (for
      PREVOTE its own term + 1, which it has not entered), ``index`` and
      ``log_term`` its last log entry; ``transfer`` marks a leadership
      transfer's campaign (it overrides leader stickiness).
    - PREVOTE_RESP / VOTE_RESP: ``reject``.
    - APPEND: ``index``/``log_term`` the entry just before ``entries``
      (prevLogIndex/prevLogTerm), ``entries``, the leader's ``commit``. An
      APPEND without entries is the heartbeat.
    - APPEND_RESP: accepted: ``index`` is the last index known to match the
      leader. Rejected: ``index`` is the rejected prevLogIndex; ``hint`` and
      ``log_term`` are the follower's largest index at or below it whose term
      is at most the APPEND's ``log_term``, and that term (the fast back-off).
    - SNAPSHOT: ``snapshot``. SNAPSHOT_RESP: ``index`` matches the leader.
    - TIMEOUT_NOW: none.
    """

    kind: str
    src: int
    dst: int
    term: int
    log_term: int = 0
    index: int = 0
    commit: int = 0
    entries: tuple[Entry, ...] = ()
    reject: bool = False
    hint: int = 0
    transfer: bool = False
    snapshot: Snapshot | None = None

    def encode(self) -> bytes:
        """Little-endian binary; one message per blob (not self-delimiting)."""
        flags = ((_FLAG_REJECT if self.reject else 0) | (_FLAG_TRANSFER if self.transfer else 0)
                 | (_FLAG_SNAPSHOT if self.snapshot is not None else 0))
        parts = [_HEAD.pack(_FORMAT_VERSION, _KIND_CODE[self.kind], flags, self.src, self.dst, self.term,
                            self.log_term, self.index, self.commit, self.hint, len(self.entries))]
        for e in self.entries:
            parts.append(_ENTRY.pack(e.term, e.index, len(e.data)))
            parts.append(e.data)
        if self.snapshot is not None:
            s = self.snapshot
            parts.append(_SNAP.pack(s.index, s.term, len(s.data)))
            parts.append(s.data)
        return b"".join(parts)

    @staticmethod
    def decode(blob: bytes) -> Message:
        """Parse ``encode``'s output.

        Raises:
            ValueError: the bytes are not one well-formed message (and never
                any other exception).
        """
        try:
            view = memoryview(blob)
            if len(view) < _HEAD.size:
                raise ValueError("raft message: too short")
            (version, code, flags, src, dst, term, log_term, index, commit, hint,
             n_entries) = _HEAD.unpack_from(view, 0)
            if version != _FORMAT_VERSION:
                raise ValueError(f"raft message: unknown version {version}")
            kind = _CODE_KIND.get(code)
            if kind is None:
                raise ValueError(f"raft message: unknown kind {code}")
            if flags & ~(_FLAG_REJECT | _FLAG_TRANSFER | _FLAG_SNAPSHOT):
                raise ValueError("raft message: unknown flags")
            if n_entries and kind != APPEND:
                raise ValueError(f"raft message: {kind} carries entries")
            if n_entries > len(view):  # every entry takes more than a byte
                raise ValueError("raft message: entry count larger than the message")
            pos = _HEAD.size
            entries = []
            for k in range(n_entries):
                (e_term, e_index), data, pos = _take(view, pos, _ENTRY, "entry")
                if e_index != index + 1 + k or e_term > term or (entries and e_term < entries[-1].term):
                    raise ValueError("raft message: entries out of order")
                entries.append(Entry(e_term, e_index, data))
            snapshot = None
            if flags & _FLAG_SNAPSHOT:
                (s_index, s_term), data, pos = _take(view, pos, _SNAP, "snapshot")
                snapshot = Snapshot(s_index, s_term, data)
            if (kind == SNAPSHOT) != (snapshot is not None):
                raise ValueError("raft message: snapshot only and always in SNAPSHOT")
            if pos != len(view):
                raise ValueError("raft message: trailing bytes")
            return Message(kind, src, dst, term, log_term=log_term, index=index, commit=commit,
                           entries=tuple(entries), reject=bool(flags & _FLAG_REJECT), hint=hint,
                           transfer=bool(flags & _FLAG_TRANSFER), snapshot=snapshot)
        except ValueError:
            raise
        except Exception as exc:  # struct.error, TypeError on non-bytes, ...
            raise ValueError(f"raft message: {exc}") from None


@dataclass
class Ready:
    """Everything a node wants done since the previous ``ready()``.

    Carry it out in this order: persist (``hard_state``, ``snapshot``,
    ``entries``), then send ``messages``, then restore from ``snapshot`` (if
    any) and apply ``committed``.

    Persisting: ``hard_state`` replaces the stored one when not None. With a
    ``snapshot``, the stored log is replaced by the snapshot followed by
    exactly ``entries`` (which then start at ``snapshot.index + 1``).
    Without, ``entries`` are appended; if ``entries[0].index`` is not past the
    last stored index, the stored log is first truncated from that index
    (conflict repair).
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)


@dataclass
class _Progress:
    """The leader's view of one follower (etcd tracker/progress.go)."""

    match: int
    next: int
    is_learner: bool
    state: str = PROBE
    probe_sent: bool = False  # PROBE: an APPEND is out; wait for an answer or the heartbeat
    pending_snapshot: int = 0  # SNAPSHOTTING: the index of the snapshot sent
    snapshot_sent_tick: int = 0
    recent_active: bool = False  # answered since the last check-quorum round
    heard_tick: int | None = None  # the tick of its last answer this leadership

    def __post_init__(self) -> None:
        assert 0 <= self.match < self.next

    def become_probe(self) -> None:
        self.state = PROBE
        self.probe_sent = False
        self.next = self.match + 1

    def become_replicate(self) -> None:
        self.state = REPLICATE
        self.probe_sent = False
        self.next = self.match + 1

    def maybe_update(self, index: int) -> bool:
        """An accepted APPEND proved the follower matches through ``index``."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """An APPEND at prevLogIndex ``rejected`` was refused; False if stale.

        A follower whose log ends before what it acknowledged (``match_hint
        < match``) lost records (``RaftStore.lost_log_end``), or the answer
        is older than its acknowledgement: either way sending again from
        ``match_hint`` is safe (the commit index, past, is not taken back;
        an old answer costs a resend). Otherwise it would never be sent
        what it lost while this node leads."""
        if match_hint < self.match and rejected <= self.match:
            self.match = match_hint
            self.next = match_hint + 1
            self.probe_sent = False
            return True
        if self.state == REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        self.probe_sent = False
        return True


class Raft:
    """One node of a Raft group. Not thread-safe; call from one task.

    Public state (read it, do not assign it): ``node_id``, ``role``,
    ``term``, ``vote``, ``leader_id`` (the leader known for the current
    term), ``commit_index``, ``applied_index`` (handed out through
    ``ready().committed`` or covered by a snapshot), ``last_index``,
    ``first_index`` (the first index still in memory), ``snapshot`` (the
    latest snapshot, sent to followers that need older entries), ``voters``
    and ``learners``.
    """

    def __init__(self, node_id: int, voters: list[int], learners: list[int] = (), *,
                 election_ticks: int = 10, heartbeat_ticks: int = 2,
                 rng: random.Random | None = None,
                 hard_state: HardState | None = None, snapshot: Snapshot | None = None,
                 entries: list[Entry] = (), lost_log_end: tuple[int, int] | None = None,
                 max_append_entries: int = 256, max_append_bytes: int = 1 << 20) -> None:
        """Start as a follower from what the store loaded.

        The caller restores its state machine from ``snapshot.data`` itself;
        committed entries after the snapshot are handed out again through
        ``ready().committed``.

        Args:
            voters, learners: the membership; disjoint; ``voters`` not empty
                and fixed; ``add_learner`` adds learners later.
            election_ticks, heartbeat_ticks: ``heartbeat_ticks < election_ticks``.
            rng: the only source of randomness (election timeouts).
            hard_state, snapshot, entries: ``RaftStore.load()``'s answer;
                entries at or below ``snapshot.index`` are ignored.
            lost_log_end: ``RaftStore.lost_log_end``: ``(term, index)`` of
                the last entry the stored log may have held before it lost
                records to damage, None if it lost nothing (see the rules).
            max_append_entries, max_append_bytes: the most one APPEND carries
                (at least one entry).

        Raises:
            ValueError: inconsistent arguments or stored state.
        """
        voters = list(dict.fromkeys(voters))
        learners = list(dict.fromkeys(learners))
        if not voters:
            raise ValueError("raft: no voters")
        if set(voters) & set(learners):
            raise ValueError("raft: a node is both voter and learner")
        if not 0 < heartbeat_ticks < election_ticks:
            raise ValueError("raft: need 0 < heartbeat_ticks < election_ticks")
        if max_append_entries < 1:
            raise ValueError("raft: max_append_entries must be at least 1")
        self.node_id = node_id
        self.voters = voters
        self.learners = learners
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.max_append_entries = max_append_entries
        self.max_append_bytes = max_append_bytes
        self._members = set(voters) | set(learners)
        self._rng = rng if rng is not None else random.Random()

        hs = hard_state if hard_state is not None else HardState(0, None, 0)
        self.term = hs.term
        self.vote = hs.vote
        self.snapshot = snapshot
        self._snap_index = snapshot.index if snapshot else 0
        self._snap_term = snapshot.term if snapshot else 0
        self._log: list[Entry] = [e for e in entries if e.index > self._snap_index]
        for k, e in enumerate(self._log):
            if e.index != self._snap_index + 1 + k:
                raise ValueError(f"raft: stored log has a gap before index {e.index}")
            prev_term = self._log[k - 1].term if k else self._snap_term
            if e.term < prev_term or e.term > self.term:
                raise ValueError(f"raft: stored log has a bad term at index {e.index}")
        self.commit_index = max(hs.commit, self._snap_index)
        if self.commit_index > self.last_index:
            raise ValueError(f"raft: stored commit {hs.commit} is past the last stored index {self.last_index}")
        self.applied_index = self._snap_index
        # Only with an odd number (>= 3) of voters can this node's lost copy
        # have been needed for a commit that no other voter's vote protects.
        odd = len(voters) % 2 == 1 and len(voters) >= 3
        self._lost_log_end = tuple(lost_log_end) if lost_log_end is not None and odd else None

        self.role = FOLLOWER
        self.leader_id: int | None = None
        self._ticks = 0  # ticks since this object was made (heard_tick's clock)
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self.election_ticks
        self._reset_randomized_timeout()
        self._votes: dict[int, bool] = {}
        self._prs: dict[int, _Progress] = {}
        self._transferee: int | None = None
        self._bcast_pending = False  # proposals wait for ready() to go out in one APPEND

        # What the next ready() reports.
        self._persisted_hs = HardState(self.term, self.vote, hs.commit)
        self._unstable_from = self.last_index + 1  # entries from here on are not persisted
        self._pending_snapshot: Snapshot | None = None
        self._msgs: list[Message] = []

    # ------------------------------------------------------------ the log

    @property
    def last_index(self) -> int:
        return self._log[-1].index if self._log else self._snap_index

    @property
    def first_index(self) -> int:
        return self._snap_index + 1

    @property
    def last_term(self) -> int:
        return self._log[-1].term if self._log else self._snap_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index``; None if compacted away or past the end."""
        if index == self._snap_index:
            return self._snap_term
        if index < self._snap_index or index > self.last_index:
            return None
        return self._log[index - self._snap_index - 1].term

    def entries(self, lo: int, hi: int | None = None) -> list[Entry]:
        """The in-memory entries with ``lo <= index < hi`` (``hi`` None: to the end)."""
        lo = max(lo, self.first_index)
        stop = len(self._log) if hi is None else max(0, min(hi - self.first_index, len(self._log)))
        return self._log[lo - self.first_index:stop]

    def _append(self, entries: list[Entry]) -> None:
        assert entries and entries[0].index == self.last_index + 1
        self._log.extend(entries)

    def _truncate_from(self, index: int) -> None:
        assert index > self.commit_index, "raft: truncating a committed entry"
        del self._log[index - self.first_index:]
        self._unstable_from = min(self._unstable_from, index)

    def _is_up_to_date(self, index: int, term: int) -> bool:
        if self.lost_log_end is not None and (term, index) < self.lost_log_end:
            return False
        return term > self.last_term or (term == self.last_term and index >= self.last_index)

    @property
    def lost_log_end(self) -> tuple[int, int] | None:
        """``(term, index)`` this node's log may have held before its store
        lost records, while its log is still behind it (and the voters are
        an odd number of at least three); None otherwise. See the rules in
        the module docstring."""
        if self._lost_log_end is not None and (self.last_term, self.last_index) >= self._lost_log_end:
            self._lost_log_end = None  # caught up: a legitimate leader's log holds all it had
        return self._lost_log_end

    def _find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest index ``<= index`` whose term is ``<= term``, with its term
        (term 0 if that part of the log is compacted)."""
        index = min(index, self.last_index)
        while index > 0:
            t = self.term_at(index)
            if t is None:
                return index, 0
            if t <= term:
                return index, t
            index -= 1
        return 0, 0

    def _commit_to(self, index: int) -> None:
        if index > self.commit_index:
            assert index <= self.last_index
            self.commit_index = index

    # ------------------------------------------------------------ roles

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def promotable(self) -> bool:
        return self.node_id in self.voters

    def _reset_randomized_timeout(self) -> None:
        self._randomized_timeout = self.election_ticks + self._rng.randrange(self.election_ticks)

    def _reset(self, term: int) -> None:
        if term != self.term:
            assert term > self.term, "raft: term going backwards"
            self.term = term
            self.vote = None
        self.leader_id = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        self._prs = {}
        self._transferee = None
        self._bcast_pending = False

    def _become_follower(self, term: int, leader: int | None) -> None:
        self._reset(term)
        self.role = FOLLOWER
        self.leader_id = leader

    def _become_precandidate(self) -> None:
        # Leaves term and vote alone: the pre-vote is for term + 1.
        self._reset(self.term)
        self.role = PRECANDIDATE

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.role = CANDIDATE
        self.vote = self.node_id

    def _become_leader(self) -> None:
        assert self.role == CANDIDATE
        self._reset(self.term)
        self.role = LEADER
        self.leader_id = self.node_id
        last = self.last_index
        for peer in self.voters + self.learners:
            if peer != self.node_id:
                self._prs[peer] = _Progress(match=0, next=last + 1, is_learner=peer in self.learners)
        self._append([Entry(self.term, last + 1, b"")])
        self._maybe_commit()
        self._bcast_append(send_if_empty=True)

    def _campaign(self, kind: str, transfer: bool = False) -> None:
        if kind == PREVOTE:
            self._become_precandidate()
            term = self.term + 1
        else:
            self._become_candidate()
            term = self.term
        self._votes[self.node_id] = True
        if self._poll() is not None:
            return  # a single voter wins at once
        for peer in self.voters:
            if peer != self.node_id:
                self._send(kind, peer, term=term, index=self.last_index, log_term=self.last_term,
                           transfer=transfer)

    def _poll(self) -> bool | None:
        """Count the votes: True won (and acted on), False lost, None undecided."""
        granted = sum(1 for v in self._votes.values() if v)
        rejected = len(self._votes) - granted
        # A node that may have lost entries it acknowledged needs a quorum
        # besides itself (module docstring).
        need = self.quorum + (1 if self.lost_log_end is not None else 0)
        if granted >= need:
            if self.role == PRECANDIDATE:
                self._campaign(VOTE)
            else:
                self._become_leader()
            return True
        if rejected > len(self.voters) - need:
            self._become_follower(self.term, None)
            return False
        return None

    # ------------------------------------------------------------ inputs

    def tick(self) -> None:
        """One logical clock tick."""
        self._ticks += 1
        if self.role == LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self.promotable and self._election_elapsed >= self._randomized_timeout:
            self._election_elapsed = 0
            self._campaign(PREVOTE)

    def leader_unreachable(self, node: int) -> None:
        """The transport found that ``node``, this follower's leader, is not
        running (a connection to it was refused: nothing listens on its
        port). Forget it as the leader, so that its lease no longer makes this
        node ignore the other voters' (pre-)votes, and campaign within a few
        ticks rather than after a whole election timeout: the remaining
        voters in id order, half an election timeout apart (1 tick, then
        1 + election_ticks // 2, ...; at most an election timeout), so that
        voters that find out at somewhat different moments still campaign
        one after the other and do not split the vote. Only liveness depends
        on it: a leader that is in fact up keeps its term (a pre-vote does
        not disturb it) and is followed again from its next APPEND."""
        if self.role != FOLLOWER or self.leader_id != node:
            return
        self.leader_id = None
        if not self.promotable:
            return
        rank = sorted(v for v in self.voters if v != node).index(self.node_id)
        wait_ticks = min(1 + self.election_ticks // 2 * rank, self.election_ticks)
        self._election_elapsed = max(self._election_elapsed, self._randomized_timeout - wait_ticks)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self.election_ticks:
            self._election_elapsed = 0
            if not self._quorum_active():
                self._become_follower(self.term, None)
                return
            self._transferee = None  # a transfer not done within an election timeout is abandoned
        if self._heartbeat_elapsed >= self.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for pr in self._prs.values():
                if pr.state == PROBE:
                    pr.probe_sent = False
                elif pr.state == SNAPSHOTTING and self._ticks - pr.snapshot_sent_tick >= self.election_ticks:
                    pr.become_probe()  # the SNAPSHOT or its answer was lost: start over
            self._bcast_append(send_if_empty=True)

    def _quorum_active(self) -> bool:
        active = 1 if self.node_id in self.voters else 0
        for peer, pr in self._prs.items():
            if pr.recent_active and not pr.is_learner:
                active += 1
            pr.recent_active = False
        return active >= self.quorum

    def add_learner(self, node_id: int) -> None:
        """Make ``node_id`` a learner: its messages are accepted from now on
        and, once this node leads (or at once if it does), it is replicated
        to, starting with a probe at the leader's last index + 1 on the next
        heartbeat (a SNAPSHOT if the entries it needs are compacted). It
        never votes and never counts in a quorum. Call it on every node so a
        later leader knows the learner too. No-op for a node already a
        voter or learner.
        """
        if node_id in self._members:
            return
        self.learners.append(node_id)
        self._members.add(node_id)
        if self.role == LEADER:
            self._prs[node_id] = _Progress(match=0, next=self.last_index + 1, is_learner=True)

    def propose(self, data: bytes) -> int | None:
        """Leader: append ``data`` to the log and return its index; else None.

        None also while a leadership transfer is under way. The entry is
        committed once ``ready().committed`` hands it out (it may still be
        lost if leadership changes first). Avoid ``b""``: committed, it looks
        like a leader's no-op entry.
        """
        if self.role != LEADER or self._transferee is not None:
            return None
        index = self.last_index + 1
        self._append([Entry(self.term, index, bytes(data))])
        self._maybe_commit()
        self._bcast_pending = True
        return index

    def transfer_leadership(self, to: int) -> bool:
        """Leader: hand leadership to voter ``to`` once it has the whole log
        (it is sent TIMEOUT_NOW and campaigns at once, overriding leader
        stickiness). Proposals are refused meanwhile; abandoned after an
        election timeout. False if not leader or ``to`` is not another voter."""
        if self.role != LEADER or to == self.node_id or to not in self.voters:
            return False
        self._transferee = to
        self._election_elapsed = 0
        if self._prs[to].match == self.last_index:
            self._send(TIMEOUT_NOW, to)
        else:
            self._send_append(to, send_if_empty=True)
        return True

    def step(self, m: Message) -> None:
        """Take one message from a peer. Messages of older terms are ignored
        (or answered with this node's term, so a stale leader steps down),
        and so are those more than ``TERM_JUMP_MAX`` terms ahead.

        Raises:
            ValueError: ``m.dst`` is not this node or ``m.kind`` is unknown.
        """
        if m.dst != self.node_id:
            raise ValueError(f"raft: message for node {m.dst} stepped into node {self.node_id}")
        if m.kind not in _KIND_CODE:
            raise ValueError(f"raft: unknown message kind {m.kind!r}")
        if m.src == self.node_id or m.src not in self._members:
            return
        if m.term > self.term + TERM_JUMP_MAX:
            return  # forged (TERM_JUMP_MAX)
        if m.term > self.term:
            if m.kind in (PREVOTE, VOTE) and not m.transfer and self._in_lease():
                return  # leader stickiness: a working leader is not disrupted
            if m.kind == PREVOTE or (m.kind == PREVOTE_RESP and not m.reject):
                pass  # a pre-vote never changes the receiver's term
            elif m.kind in (APPEND, SNAPSHOT):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            if m.kind in (APPEND, SNAPSHOT):
                # A stale leader: tell it the newer term so it steps down (it may
                # otherwise never learn it, since pre-vote keeps terms from rising).
                self._send(APPEND_RESP, m.src)
            elif m.kind == PREVOTE:
                self._send(PREVOTE_RESP, m.src, reject=True)
            return

        if m.kind in (PREVOTE, VOTE):
            self._handle_vote_request(m)
        elif self.role == LEADER:
            self._step_leader(m)
        elif self.role in (CANDIDATE, PRECANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _in_lease(self) -> bool:
        return self.leader_id is not None and self._election_elapsed < self.election_ticks

    def _handle_vote_request(self, m: Message) -> None:
        pre = m.kind == PREVOTE
        resp = PREVOTE_RESP if pre else VOTE_RESP
        can_vote = (self.vote == m.src or (self.vote is None and self.leader_id is None)
                    or (pre and m.term > self.term))
        if self.promotable and can_vote and self._is_up_to_date(m.index, m.log_term):
            self._send(resp, m.src, term=m.term)
            if not pre:
                self._election_elapsed = 0
                self.vote = m.src
        else:
            self._send(resp, m.src, reject=True)

    def _step_candidate(self, m: Message) -> None:
        if m.kind in (APPEND, SNAPSHOT):
            self._become_follower(self.term, m.src)
            self._step_follower(m)
        elif self.role == PRECANDIDATE and m.kind == PREVOTE_RESP:
            if m.term == self.term + 1 and not m.reject or m.term == self.term and m.reject:
                self._record_vote(m.src, not m.reject)
        elif self.role == CANDIDATE and m.kind == VOTE_RESP:
            self._record_vote(m.src, not m.reject)

    def _record_vote(self, voter: int, granted: bool) -> None:
        if voter in self.voters and voter not in self._votes:
            self._votes[voter] = granted
            self._poll()

    def _step_follower(self, m: Message) -> None:
        if m.kind == APPEND:
            self.leader_id = m.src
            self._election_elapsed = 0
            self._handle_append(m)
        elif m.kind == SNAPSHOT:
            self.leader_id = m.src
            self._election_elapsed = 0
            self._handle_snapshot(m)
        elif m.kind == TIMEOUT_NOW and self.promotable:
            self._campaign(VOTE, transfer=True)

    def _handle_append(self, m: Message) -> None:
        if m.index < self.commit_index:
            # Everything up to our commit matches any leader's log.
            self._send(APPEND_RESP, m.src, index=self.commit_index)
            return
        if self.term_at(m.index) != m.log_term:
            hint, hint_term = self._find_conflict_by_term(m.index, m.log_term)
            self._send(APPEND_RESP, m.src, index=m.index, reject=True, hint=hint, log_term=hint_term)
            return
        new = list(m.entries)
        for k, e in enumerate(new):
            if self.term_at(e.index) != e.term:
                if e.index <= self.last_index:
                    self._truncate_from(e.index)
                self._append(new[k:])
                break
        last_new = m.index + len(new)
        self._commit_to(min(m.commit, last_new))
        self._send(APPEND_RESP, m.src, index=last_new)

    def _handle_snapshot(self, m: Message) -> None:
        s = m.snapshot
        assert s is not None
        if s.index <= self.commit_index:
            self._send(SNAPSHOT_RESP, m.src, index=self.commit_index)
            return
        if self.term_at(s.index) == s.term:
            # Our log already holds the snapshot's last entry, so (log matching)
            # everything before it: commit up to it and apply from the log.
            self._commit_to(s.index)
            self._send(SNAPSHOT_RESP, m.src, index=s.index)
            return
        self.snapshot = s
        self._snap_index, self._snap_term = s.index, s.term
        self._log = []
        self.commit_index = s.index
        self.applied_index = s.index
        self._pending_snapshot = s
        self._unstable_from = s.index + 1
        self._send(SNAPSHOT_RESP, m.src, index=s.index)

    # ------------------------------------------------------------ the leader

    def _step_leader(self, m: Message) -> None:
        pr = self._prs.get(m.src)
        if pr is None or m.kind not in (APPEND_RESP, SNAPSHOT_RESP):
            return
        pr.recent_active = True
        pr.heard_tick = self._ticks
        if m.kind == SNAPSHOT_RESP:
            pr.maybe_update(m.index)
            if pr.state == SNAPSHOTTING:
                pr.become_probe()
            self._send_append(m.src)
            return
        if m.reject:
            if pr.state == SNAPSHOTTING:
                return
            probe = m.hint
            if m.log_term > 0:
                probe, _ = self._find_conflict_by_term(m.hint, m.log_term)
            if pr.maybe_decr_to(m.index, probe):
                if pr.state == REPLICATE:
                    pr.become_probe()
                self._send_append(m.src, send_if_empty=True)
            return
        if pr.maybe_update(m.index):
            if pr.state == PROBE:
                pr.become_replicate()
            elif pr.state == SNAPSHOTTING and pr.match >= pr.pending_snapshot:
                pr.become_replicate()
            if self._maybe_commit():
                self._bcast_append(send_if_empty=True)  # tell everyone the new commit
            else:
                self._send_append(m.src)
            if m.src == self._transferee and pr.match == self.last_index:
                self._send(TIMEOUT_NOW, m.src)
        elif pr.state == PROBE:
            self._send_append(m.src)

    def _maybe_commit(self) -> bool:
        matches = sorted((self.last_index if v == self.node_id else self._prs[v].match for v in self.voters),
                         reverse=True)
        n = matches[self.quorum - 1]
        if n > self.commit_index and self.term_at(n) == self.term:
            self._commit_to(n)
            return True
        return False

    def _bcast_append(self, send_if_empty: bool = False) -> None:
        for peer in self._prs:
            self._send_append(peer, send_if_empty)

    def _send_append(self, to: int, send_if_empty: bool = False) -> None:
        pr = self._prs[to]
        if pr.state == SNAPSHOTTING or (pr.state == PROBE and pr.probe_sent):
            return
        prev = pr.next - 1
        prev_term = self.term_at(prev)
        if prev_term is None:
            assert prev < self._snap_index and self.snapshot is not None
            pr.state = SNAPSHOTTING
            pr.pending_snapshot = self.snapshot.index
            pr.snapshot_sent_tick = self._ticks
            self._send(SNAPSHOT, to, snapshot=self.snapshot)
            return
        entries: list[Entry] = []
        size = 0
        for e in self.entries(pr.next, pr.next + self.max_append_entries):
            if entries and size + len(e.data) > self.max_append_bytes:
                break
            entries.append(e)
            size += len(e.data)
        if not entries and not send_if_empty:
            return
        self._send(APPEND, to, index=prev, log_term=prev_term, entries=tuple(entries), commit=self.commit_index)
        if pr.state == REPLICATE:
            if entries:
                pr.next = entries[-1].index + 1
        else:
            pr.probe_sent = True

    def peers_heard_within(self, ticks: int) -> set[int]:
        """Leader: the nodes (voters and learners) that answered this leader
        within the last ``ticks`` ticks, with this node itself. Empty when
        not leader. Use it for node liveness: a node absent from it for an
        election timeout is unreachable from the leader."""
        if self.role != LEADER:
            return set()
        heard = {self.node_id}
        for peer, pr in self._prs.items():
            if pr.heard_tick is not None and self._ticks - pr.heard_tick <= ticks:
                heard.add(peer)
        return heard

    def match_indexes(self) -> dict[int, int]:
        """Leader: each follower's known matching index (monitoring); empty otherwise."""
        return {peer: pr.match for peer, pr in self._prs.items()}

    # ------------------------------------------------------------ outputs

    def _send(self, kind: str, to: int, *, term: int | None = None, **fields) -> None:
        self._msgs.append(Message(kind, self.node_id, to, self.term if term is None else term, **fields))

    def compact(self, index: int, data: bytes) -> None:
        """The application's state machine ``data`` as of applied ``index``:
        keep it as the snapshot sent to followers that need entries before it
        and drop log entries ``<= index`` from memory. The caller persists it
        (``RaftStore.save_snapshot(raft.snapshot)``). No-op if ``index`` is
        not past the current snapshot.

        Raises:
            ValueError: ``index`` was not handed out through ``ready().committed`` yet.
        """
        if index > self.applied_index:
            raise ValueError(f"raft: compact({index}) past the applied index {self.applied_index}")
        if index <= self._snap_index:
            return
        term = self.term_at(index)
        assert term is not None
        self.snapshot = Snapshot(index, term, bytes(data))
        del self._log[:index - self._snap_index]
        self._snap_index, self._snap_term = index, term

    def has_ready(self) -> bool:
        return bool(self._msgs or self._bcast_pending or self._pending_snapshot is not None
                    or self._unstable_from <= self.last_index or self.commit_index > self.applied_index
                    or self._hard_state() != self._persisted_hs)

    def _hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.commit_index)

    def ready(self) -> Ready:
        """Everything pending since the last call. Calling it is the caller's
        promise to persist, send and apply it, in that order."""
        if self._bcast_pending:
            self._bcast_pending = False
            self._bcast_append()
        hs = self._hard_state()
        rd = Ready(
            hard_state=hs if hs != self._persisted_hs else None,
            entries=self.entries(self._unstable_from),
            snapshot=self._pending_snapshot,
            committed=self.entries(self.applied_index + 1, self.commit_index + 1),
            messages=self._msgs,
        )
        assert not rd.committed or rd.committed[0].index == self.applied_index + 1
        assert rd.snapshot is None or not rd.entries or rd.entries[0].index == rd.snapshot.index + 1
        self._persisted_hs = hs
        self._unstable_from = self.last_index + 1
        self._pending_snapshot = None
        self.applied_index = self.commit_index
        self._msgs = []
        return rd
