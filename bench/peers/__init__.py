"""Peer systems the benchmark compares Tidemark with (each module: a server class and workload roles)."""
