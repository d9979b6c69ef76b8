"""The name server: brokers register, clients find them (RocketMQ's NameServer)."""
