"""Tidemark: a message broker on RocketMQ's consumer model, its client library and its Spark connector.

The root package lives in proto/ with the protocol it speaks (tidemark.v1, tidemark.rmq5.v2: the .proto
files and the code generated from them); the rest is mapped in from the top-level folders
(pyproject.toml's package-dir): tidemark.common (common/), tidemark.broker (broker/), tidemark.client
(client/), tidemark.spark_connector (spark_connector/).
"""
