# Tidemark images, one file with two targets. Build them with `make images` (tools/images.py): it
# makes the wheelhouse in build/wheels that these stages install from, with no package index.
#   broker: the daemon; only what the broker needs; non-root; data in the /data volume; gRPC health
#           check; SIGTERM = graceful stop (stop accepting, flush the store and the offsets).
#   spark:  Tidemark with the Spark connector, pyspark and a JRE, for the Spark master, worker and job;
#           non-root, with the install read-only and Spark's work and scratch dirs under /home/tidemark.
# BASE_IMAGE: any Debian-based image with python3 (3.11+) and its venv module; python:3.11-slim by
# default, a local debootstrap'd bookworm where no registry can be reached.
ARG BASE_IMAGE=python:3.11-slim

# Stages in build order: the legacy builder builds every stage up to --target, so the broker's come
# first and a broker build never touches the Spark wheels.
FROM ${BASE_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY build/wheels/run /wheels
RUN python3 -m venv /opt/tidemark \
 && /opt/tidemark/bin/pip install --quiet --no-index --find-links /wheels tidemark

# Without pip and setuptools: nothing at run time installs anything.
FROM venv AS broker-venv
RUN /opt/tidemark/bin/python -m pip uninstall --quiet --yes pip setuptools

FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/tidemark/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
RUN useradd --system --uid 10001 --home-dir /home/tidemark --create-home --shell /usr/sbin/nologin tidemark

FROM runtime AS broker
COPY --from=broker-venv /opt/tidemark /opt/tidemark
RUN install -d -o tidemark /data
VOLUME ["/data"]
USER tidemark
EXPOSE 10911 9090
HEALTHCHECK --interval=5s --timeout=3s --start-period=15s --retries=3 \
    CMD ["tidemark", "health", "--broker", "127.0.0.1:10911"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tidemark", "broker"]
CMD ["--data-dir", "/data", "--host", "0.0.0.0", "--port", "10911"]

FROM venv AS spark-venv
COPY build/wheels/spark /wheels-spark
RUN /opt/tidemark/bin/pip install --quiet --no-index --find-links /wheels --find-links /wheels-spark 'tidemark[spark]'

FROM runtime AS spark
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=spark-venv /opt/tidemark /opt/tidemark
COPY examples /opt/tidemark/examples
# The install stays root-owned and read-only: Spark writes only under the user's home.
RUN ln -s "$(/opt/tidemark/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark \
 && install -d -o tidemark /home/tidemark/spark-work /home/tidemark/spark-tmp
ENV SPARK_HOME=/opt/spark PATH=/opt/spark/bin:/opt/tidemark/bin:${PATH} PYSPARK_PYTHON=/opt/tidemark/bin/python \
    SPARK_WORKER_DIR=/home/tidemark/spark-work SPARK_LOCAL_DIRS=/home/tidemark/spark-tmp
USER tidemark
WORKDIR /opt/tidemark
