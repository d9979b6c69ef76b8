"""A broker among others: replication of the commit log and metadata from master to replicas
(replication.py, replica_progress.py, replication_checkpoint.py), the role that survives restarts and
fences a replaced master (roles.py), the broker-wide read/write permission (permission.py), and
registration with the name servers (registration.py).

Reads the store, topics, groups, offsets, producers, pop and delay state to copy them; never imports
the controller or a protocol adapter.
"""
