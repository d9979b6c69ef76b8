"""How a bad option reaches the user through PySpark 4.3: the connector's one-line message, not a traceback.

PySpark runs the data source's planning methods (schema, reader, streamReader, writer, partitions,
initialOffset, ...) in Python worker processes. An exception escaping one is formatted by the worker
(pyspark.util.handle_worker_exception) as a whole Python traceback, which the JVM wraps in an
AnalysisException: 11 to 29 lines for a misspelled option. The worker writes the exception's last line
alone when SPARK_HIDE_TRACEBACK is in its environment, which is what the session conf
spark.sql.execution.pyspark.udf.hideTraceback.enabled sets, for every Python error of the session.

An OptionError's message is the whole story (which option, what is wrong, what is allowed), so the
connector sets that variable in the failing worker alone, right before the error leaves it. Such a
worker reports the error and exits (pyspark.daemon never reuses a worker whose main failed), so no
other error, of this query or of another, is formatted differently. In the driver's own process
(tests, a user calling the data source directly) nothing is set.

What stays is Spark's and no data source method can change it: the error class and its prefix
("[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source instance: "), the exception's
qualified name, the SQLSTATE; for a stream, StreamingQueryException's header and the query's
description, reported by awaitTermination() or exception() rather than start(), since Spark creates
the stream reader in the query's thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from tidemark.spark_connector.options import OptionError

# Set by Spark's JVM in the environment of every Python worker it starts, never in the driver's.
_WORKER_MARK = ("SPARK_PYTHON_RUNTIME", "PYTHON_WORKER")


@contextlib.contextmanager
def option_errors_in_one_line() -> Iterator[None]:
    """Around (or decorating) a planning method: an OptionError leaving it is reported as its message."""
    try:
        yield
    except OptionError:
        if os.environ.get(_WORKER_MARK[0]) == _WORKER_MARK[1]:
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        raise


__all__ = ["option_errors_in_one_line"]
