"""What the broker, the client and the Spark connector share (package tidemark.common).

- protocol.py: the wire rules besides the .proto files: names, property keys, tags, delay levels,
  message ids, the error-class trailer.
- records.py: the record layout producers write, the broker checks and stores as it came, consumers decode.
- auth.py: request signing (RocketMQ's ACL signature) for clients, brokers and name servers.
- logs.py: structured logging (key=value or JSON lines) with an event name per line.
- scheduler.py: one Scheduler per process, owning every periodic task; cancel_and_wait.
- fsutil.py: atomic file replacement (temp file, fsync, rename, directory fsync).

It imports nothing of tidemark but itself and the generated protocol code.
"""
