"""Idempotent producers: the broker-side table of producer ids and sequences (broker/producers/table.py)."""
