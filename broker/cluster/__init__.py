"""A broker among others: replication of the commit log and metadata from master to replicas
(replication.py the master's side, replica_sync.py the replica's, replica_progress.py,
replication_checkpoint.py), the role that survives restarts and fences a replaced master (roles.py),
the broker-wide read/write permission (permission.py), where consumer offsets may be read and changed
(offset_authority.py), registration with the name servers (registration.py), and controller mode, where
etcd elects the master (election.py, controller_mode.py).

Reads the store, topics, groups, offsets, producers, pop and delay state to copy them; never imports
the controller or a protocol adapter.
"""
