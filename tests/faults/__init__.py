"""Fault injection and a history checker: Tidemark's guarantees tested the way Jepsen tests queues.

- proxy.py: FaultProxy, a TCP proxy that resets, blackholes, delays, throttles
  and half-closes the connections between any two parties;
- netns.py: hosts in network namespaces, so a partition drops real packets;
- disk.py: a small tmpfs to fill, for full-disk faults;
- history.py: every client operation recorded (invoke, ok, fail, info);
- checker.py: the read-back judged against the history (lost, unexpected,
  duplicated, recovered, misplaced, offsets backwards, order, windows);
- workloads.py, nemesis.py, scenarios.py: producers and consumers that record
  their history, seeded schedules of faults, and the scenarios that combine
  them over real broker, replica and name server processes;
- run.py: one run (cluster, workloads, nemesis, read-back, verdict);
- torture.py: `make torture` (`python -m tests.faults.torture`), seeded runs in bulk.

docs/guarantees.md says what each mode promises and which scenarios back it.
"""
