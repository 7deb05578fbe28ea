"""ReadAnswers: the daemon's answers to GET, EXISTS and CONTAINS.

A read whose keys the memory tier holds in full is answered on the socket thread
(``from_memory``: a lookup, no store I/O; a GET's reply frames are the cached
records, or, through a shared-memory lease, copies in slots lent to it up to
``SOCKET_COPY_BYTES``). Any other read is queued for the reader threads, which call
``serve``: the store reads the records straight into reply-pool buffers, and the
reply takes what fits the reply budget (``replies``), the rest answered as misses.
The pages of a reply are claimed from the budget before the reply exists, so
readers serving several clients at once never together exceed it.
"""

from __future__ import annotations

from hicache.daemon.metrics import DaemonMetrics
from hicache.daemon.readers import ReadDone, ReadJob
from hicache.daemon.replies import ReplyBudget
from hicache.daemon.reply_pool import ReplyPool
from hicache.daemon.shm_plane import ShmPlane
from hicache.daemon.store import DaemonStore, Lookup
from storage_backends.remote.protocol import (
    ContainsReply,
    ErrorCode,
    ErrorReply,
    ExistsReply,
    Frame,
    GetReply,
    Limits,
    Op,
    ProtocolError,
)

# A GET through a shared-memory lease is copied into the slab on the socket thread only up
# to this many bytes (the remote backend asks for about 1 MiB at a time); a bigger one is
# copied by a reader, record by record, so other clients' requests get turns in between.
SOCKET_COPY_BYTES = 4 << 20


class ReadAnswers:
    """Builds read replies (see the module docstring); holds no state of its own.

    ``from_memory`` runs on the socket thread, ``serve`` on reader threads (the
    store, the reply pool, the budget, the slab and the metrics are thread-safe).
    ``serve`` answers a bad request with an error reply; anything else it raises
    is a bug or a store failure, which the readers turn into an INTERNAL reply.
    """

    def __init__(
        self,
        store: DaemonStore,
        pool: ReplyPool,
        replies: ReplyBudget,
        metrics: DaemonMetrics,
        limits: Limits,
        shm: ShmPlane | None,
    ) -> None:
        self._store = store
        self._pool = pool
        self._replies = replies
        self._metrics = metrics
        self._limits = limits
        self._shm = shm

    def from_memory(self, job: ReadJob) -> ReadDone | None:
        """The answer to a read the memory tier holds in full, given on the socket thread
        (no store I/O, no page copied: a GET's reply frames are the cached records);
        None to queue it for the readers instead (a key not in memory, or a GET reply
        that does not fit the reply budget or cap, whose partial answer readers give)."""
        request = job.request
        if request.lease:
            return self._lent_from_memory(job)
        if request.op is not Op.GET:
            if not self._store.all_cached(job.keys):
                return None
            if request.op is Op.EXISTS:
                return ReadDone(job, ExistsReply(request.id, len(job.keys)))
            return ReadDone(job, ContainsReply(request.id, (True,) * len(job.keys)))
        records = self._store.cached(job.keys)
        if records is None:
            return None
        sizes = [len(record) for record in records]
        if sum(sizes) > self._limits.max_request_bytes:
            return None
        fits = self._replies.claim(job.peer, sizes)
        if fits < len(sizes):
            self._replies.unclaim(job.peer, sum(sizes[:fits]))
            return None
        self._metrics.looked_up(len(records), 0, 0)
        reply = GetReply(request.id, (True,) * len(records), tuple(records))
        return ReadDone(job, reply, sum(sizes))

    def _lent_from_memory(self, job: ReadJob) -> ReadDone | None:
        """``from_memory`` for a GET through a lease (only GET and PUT name one): what the
        memory tier holds in full is copied into slots lent to the lease here (a copy holds
        the GIL on whichever thread makes it); None to queue the read for the readers (a
        key not in memory, or no room in the slab)."""
        assert self._shm is not None
        records = self._store.cached(job.keys)
        if records is None or sum(len(record) for record in records) > SOCKET_COPY_BYTES:
            return None
        spans = self._shm.lend(job.request.lease, records)
        if spans is None:
            return None
        self._metrics.looked_up(len(records), 0, 0)
        return ReadDone(job, GetReply(job.request.id, (True,) * len(records), (), spans))

    def serve(self, job: ReadJob) -> ReadDone:
        """Answer one GET, EXISTS or CONTAINS (on a reader thread)."""
        request = job.request
        try:
            if request.op is Op.EXISTS:
                count = self._store.exists(job.keys, job.tenant)
                return ReadDone(job, ExistsReply(request.id, count))
            if request.op is Op.CONTAINS:
                present = tuple(self._store.contains(job.keys, job.tenant))
                return ReadDone(job, ContainsReply(request.id, present))
            return self._get(job)
        except ProtocolError as exc:
            return ReadDone(job, ErrorReply(request.id, exc.code, exc.message))

    def _get(self, job: ReadJob) -> ReadDone:
        # Replies are capped like requests and by the room left for replies not yet taken
        # by this peer (and all peers), so a client that never reads cannot pile up memory.
        # The pages read are claimed before the reply is built, so readers serving several
        # peers at once never together exceed the total room.
        room = self._replies.room(job.peer)
        if room <= 0:
            raise ProtocolError(ErrorCode.BUSY, "earlier replies are still unread; retry later")
        cap = min(room, self._limits.max_request_bytes)
        lookup = self._store.get(job.keys, job.request.keys, cap, job.tenant, self._pool)
        try:
            lent = self._lent_reply(job, lookup) if job.request.lease else None
            return lent if lent is not None else self._reply_of(job, lookup, room)
        except BaseException:  # no reply will hold the pool's buffers: they come back now
            self._pool.give_back_all(self._pool.lent_out(lookup.records))
            raise

    def _lent_reply(self, job: ReadJob, lookup: Lookup) -> ReadDone | None:
        """The GET reply through the job's lease: the records copied into slots lent to it
        (the pool's buffers come back at once); None when the slab has no room for them."""
        assert self._shm is not None
        hits = [record for record in lookup.records if record is not None]
        spans = self._shm.lend(job.request.lease, hits)
        if spans is None:
            return None
        self._pool.give_back_all(self._pool.lent_out(lookup.records))
        self._metrics.looked_up(lookup.memory_hits, lookup.store_hits, len(job.keys) - len(hits))
        found = tuple(record is not None for record in lookup.records)
        return ReadDone(job, GetReply(job.request.id, found, (), spans))

    def _reply_of(self, job: ReadJob, lookup: Lookup, room: int) -> ReadDone:
        """The GET reply of what the store read, within the reply budget's ``room``."""
        records = lookup.records
        sizes = [len(record) for record in records if record is not None]
        fits = self._replies.claim(job.peer, sizes)
        if fits < len(sizes):  # other peers' readers claimed the total room meanwhile
            records = _keep_hits(records, fits)
            kept = {id(record) for record in records if record is not None}
            dropped = [r for r in lookup.records if r is not None and id(r) not in kept]
            self._pool.give_back_all(self._pool.lent_out(dropped))
        pages = tuple(record for record in records if record is not None)
        truncated = lookup.truncated or fits < len(sizes)
        if truncated and not pages and room < self._limits.max_request_bytes:
            raise ProtocolError(ErrorCode.BUSY, "earlier replies are still unread; retry later")
        misses = len(job.keys) - len(pages)
        self._metrics.looked_up(lookup.memory_hits, lookup.store_hits, misses)
        found = tuple(record is not None for record in records)
        reply = GetReply(job.request.id, found, pages)
        return ReadDone(job, reply, sum(sizes[:fits]), buffers=tuple(self._pool.lent_out(pages)))


def _keep_hits(records: list[Frame | None], count: int) -> list[Frame | None]:
    """``records`` with every hit after the first ``count`` turned into a miss."""
    kept: list[Frame | None] = []
    for record in records:
        if record is not None and count <= 0:
            record = None
        elif record is not None:
            count -= 1
        kept.append(record)
    return kept
