"""RocketMQ 5's gRPC protocol (`apache.rocketmq.v2.MessagingService`) on the broker's port.

One more thin adapter over the broker's domain modules, beside the tidemark.v1
servicers: it translates the official clients' requests into the same sends,
group registrations and (pop) reads, and the domain's answers and errors into
the protocol's messages and result codes. No domain rule lives here.

- `service.py`: the method table and the servicer;
- `telemetry.py`: the clients' settings stream and the registry of connected clients;
- `convert.py`: messages both ways, durations and timestamps;
- `status.py`: domain errors to result codes.

The wire messages are Tidemark's own declaration of the protocol
(proto/tidemark/rmq5/v2/messaging.proto); docs/design/rocketmq5-adapter.md
records what the official clients send and expect.
"""
