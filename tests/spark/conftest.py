"""Spark fixtures: one local[2] SparkSession shared by the whole test session, plus a broker kit.

A JVM holds one SparkContext at a time. test_spark_standalone.py needs one bound
to a standalone master, so collection moves that module to the end of the run:
the local session is created once, stopped once when the standalone module
starts, and re-created (by `spark`) only if some test asks for it afterwards.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from spark_testlib import Kit, base_builder, stop_active_session

from tidemark import spark_connector

STANDALONE_MODULE = "test_spark_standalone.py"

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_collection_modifyitems(session, config, items) -> None:
    items.sort(key=lambda item: item.path.name == STANDALONE_MODULE)  # stable: only moves that module last


def local_session() -> SparkSession:
    active = SparkSession.getActiveSession()
    if active is not None and SparkContext._active_spark_context is not None:
        if active.sparkContext.master == "local[2]":
            return active
        stop_active_session()
    spark = base_builder("local[2]", "tidemark-tests").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark


@pytest.fixture(scope="session")
def _spark_cleanup() -> Iterator[None]:
    yield
    if SparkContext._active_spark_context is not None:
        stop_active_session()


@pytest.fixture
def spark(_spark_cleanup) -> SparkSession:
    """The shared local[2] session with format("tidemark") registered."""
    return local_session()


@pytest.fixture(scope="module")
def kit(module_broker) -> Kit:
    """Topics and messages on a broker shared by the module's tests."""
    return Kit(module_broker.address)
