"""Tidemark broker: message store, consumer offset manager and gRPC services."""
