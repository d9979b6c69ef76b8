"""Recovery at load: the consume queues made to agree with the commit log again (RocketMQ's
recoverNormally/recoverAbnormally, one path for both).

The commit log is the truth; a consume queue is an index of it that may run
behind (entries not yet flushed at a crash) or ahead (entries of records a
torn tail lost). So, from the checkpoint, which vouches for everything before
it: every valid record is indexed again where its queue lacks the entry (an
entry already there is kept), the log is cut at its first invalid record,
and every queue drops its entries past that end and before the log's oldest
segment. A record older than its topic's deletion (a tombstone of the
checkpoint) indexes nothing: the re-created topic starts at offset 0.
"""

from __future__ import annotations

from tidemark.broker.store.checkpoint import StoreCheckpoint
from tidemark.broker.store.commitlog import CommitLog, ScanResult
from tidemark.broker.store.consumequeue import ConsumeQueueTable


def recover(commitlog: CommitLog, queues: ConsumeQueueTable, checkpoint: StoreCheckpoint) -> tuple[ScanResult, int, int]:
    """Open the commit log and the consume queues and bring the queues in line with the log; the log's
    scan, the entries indexed again, and the queue entries dropped."""
    start = checkpoint.load()
    commitlog.open()
    dropped = queues.load()
    tombstones = checkpoint.tombstones()
    redispatched = 0

    def redispatch(topic: str, queue_id: int, queue_offset: int, phys: int, size: int, tags: int) -> None:
        nonlocal redispatched
        if phys < tombstones.get(topic, -1):
            return  # a record of a deleted topic's earlier life
        if queues.get_or_create(topic, queue_id).ensure_entry(queue_offset, phys, size, tags):
            redispatched += 1

    scan = commitlog.recover(start, redispatch)
    for queue in queues:
        dropped += queue.truncate_from_commit_log_offset(scan.end)
        queue.correct_min_offset(commitlog.min_offset)
    return scan, redispatched, dropped
