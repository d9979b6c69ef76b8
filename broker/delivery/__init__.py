"""Messages out by queue offset: the unary pull (pull.py), the streaming fetch session (fetch.py), the
waiters woken when a queue changes (waiters.py: parked pulls, fetch sessions, lock and pop waiters),
read-only questions about stored messages (queries.py), and queues changing hands between a group's
members (handover.py: lock waits, final commits, owners woken).

Builds on the store, topics, offsets and membership (locks, fences); pop/ is the other way out.
Never imports ingest/, the controller or a protocol.
"""
