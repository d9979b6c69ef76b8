"""What the broker tells about itself: Prometheus metrics (event counters, state gauges computed per scrape),
the persistence health behind its gRPC health status, `tidemark broker status`, and the containers' probe.

Reads the rest of the broker; nothing of the broker's domain imports it back except to count (metrics) or
report (health). The controller appears here only as a type.
"""
