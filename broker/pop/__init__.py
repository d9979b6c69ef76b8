"""Pop consumption (RocketMQ 5): receipt handles, the pop ledger and its journal; grpc-free.

handles.py signs and checks receipt handles, ledger.py is the state of every
delivery (pure, event-sourced), journal.py makes that state survive a crash.
The gRPC adapter and the revive/renew timers live elsewhere and call these.
"""
