# Tidemark images, one file with two targets:
#   broker (default): the daemon; non-root, data in the /data volume, gRPC health check,
#                     SIGTERM = graceful stop (stop accepting, flush store and offsets).
#   spark:            Python + a JRE + pyspark + Tidemark, for the Spark master, worker and job.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/tidemark
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY broker ./broker
COPY client ./client
COPY spark_connector ./spark_connector
COPY examples ./examples
RUN pip install grpcio-tools==1.85.1 \
 && python -m grpc_tools.protoc -I proto --python_out=proto --pyi_out=proto --grpc_python_out=proto \
        proto/tidemark/v1/common.proto proto/tidemark/v1/messaging.proto proto/tidemark/v1/offsets.proto \
        proto/tidemark/v1/membership.proto proto/tidemark/v1/admin.proto \
 && pip install . \
 && useradd --system --uid 10001 --home-dir /home/tidemark --create-home --shell /usr/sbin/nologin tidemark

FROM base AS spark
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
RUN ln -s "$(python -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV SPARK_HOME=/opt/spark PATH="/opt/spark/bin:${PATH}" PYSPARK_PYTHON=python
USER tidemark
WORKDIR /opt/tidemark

FROM base AS broker
RUN mkdir /data && chown tidemark /data
VOLUME ["/data"]
USER tidemark
EXPOSE 10911 9090
HEALTHCHECK --interval=5s --timeout=3s --start-period=15s --retries=3 \
    CMD ["tidemark", "health", "--broker", "127.0.0.1:10911"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tidemark", "broker"]
CMD ["--data-dir", "/data", "--host", "0.0.0.0", "--port", "10911"]
