"""Messages in: SendService (checks, routing to a queue, idempotent record batches, transactional halves),
delay levels and delivery times (delays.py: the schedule topic), and a consumer's send-back to its retry
topic or dead-letter queue (send_back.py).

Builds on the store, topics, producers and transactions; waits on cluster/ only for sync replication.
Never imports delivery/, the controller or a protocol.
"""
