# Tidemark images, one file with two targets. Build them with `make images` (tools/images.py): it
# makes the wheelhouse in build/wheels that these stages install from, with no package index.
#   broker: the daemon; only what the broker needs; non-root; data in the /data volume; /healthz
#           check; SIGTERM = graceful stop (stop accepting, flush the store and the offsets).
#   spark:  Tidemark with the Spark connector, pyspark and a JRE, for the Spark master, worker and job;
#           non-root, with the install read-only and Spark's work and scratch dirs under /home/tidemark,
#           made here and owned by the user (compose runs the Spark containers with a read-only root).
# BASE_IMAGE: any Debian-based image with python3 (3.11+) and its venv module; python:3.11-slim by
# default, a local debootstrap'd bookworm where no registry can be reached.
#
# Each image is the dependencies' venv (one layer, cached until its wheel set changes) and Tidemark in
# /opt/tidemark/app (on sys.path through a .pth file, its command in app/bin): a code change rebuilds
# about 1 MB, not the Spark image's 1 GB. Neither image keeps pip or setuptools.
#
# Every image made here carries the label io.tidemark.stage. The stages only copied from (app, broker-deps,
# spark-deps) end in a label naming the build (BUILD_ID, after their RUNs so it never costs their cache):
# tools/images.py tags exactly that build's as tidemark/build-cache:STAGE, the layer cache of the next
# build, and removes the untagged images with the label, so no build leaves dangling images behind.
ARG BASE_IMAGE=python:3.11-slim

# Stages in build order: the legacy builder builds every stage up to --target, so the broker's come
# first and a broker build never touches the Spark wheels.
FROM ${BASE_IMAGE} AS venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/tidemark

# The venv's pip installs Tidemark, so its command's #! names /opt/tidemark/bin/python, as in both images.
FROM venv AS app
COPY build/wheels/app /wheels
RUN /opt/tidemark/bin/pip install --quiet --no-index --no-deps --target /opt/tidemark/app /wheels/tidemark-*.whl
ARG BUILD_ID=
LABEL io.tidemark.stage=app io.tidemark.build=${BUILD_ID}

FROM venv AS broker-deps
COPY build/wheels/broker /wheels
RUN /opt/tidemark/bin/pip install --quiet --no-index --find-links /wheels -r /wheels/requirements.txt \
 && /opt/tidemark/bin/python -m pip uninstall --quiet --yes pip setuptools \
 && echo /opt/tidemark/app > "$(/opt/tidemark/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tidemark-app.pth"
ARG BUILD_ID=
LABEL io.tidemark.stage=broker-deps io.tidemark.build=${BUILD_ID}

FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/tidemark/app/bin:/opt/tidemark/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8
RUN groupadd --system --gid 10001 tidemark \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/tidemark --create-home --shell /usr/sbin/nologin tidemark

FROM runtime AS broker
COPY --from=broker-deps /opt/tidemark /opt/tidemark
COPY --from=app /opt/tidemark/app /opt/tidemark/app
RUN install -d -o tidemark -g tidemark /data
VOLUME ["/data"]
USER tidemark
EXPOSE 10911 9090
# Metrics and /healthz on 9090 (loopback unless TIDEMARK_METRICS_HOST says otherwise); the probe is the
# standard library's, tens of milliseconds of CPU where `tidemark health` takes about 0.4 s.
ENV TIDEMARK_METRICS_PORT=9090
HEALTHCHECK --interval=5s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-m", "tidemark.broker.observe.probe", "http://127.0.0.1:9090/healthz"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tidemark", "broker"]
CMD ["--data-dir", "/data", "--host", "0.0.0.0", "--port", "10911"]
LABEL io.tidemark.stage=broker

FROM venv AS spark-deps
COPY build/wheels/spark /wheels
RUN /opt/tidemark/bin/pip install --quiet --no-index --find-links /wheels -r /wheels/requirements.txt \
 && /opt/tidemark/bin/python -m pip uninstall --quiet --yes pip setuptools \
 && echo /opt/tidemark/app > "$(/opt/tidemark/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tidemark-app.pth"
ARG BUILD_ID=
LABEL io.tidemark.stage=spark-deps io.tidemark.build=${BUILD_ID}

FROM runtime AS spark
RUN apt-get update \
 && apt-get install -y --no-install-recommends default-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/*
COPY --from=spark-deps /opt/tidemark /opt/tidemark
# The install stays root-owned and read-only: Spark writes only in these two dirs, owned by the user. The
# worker's work dir holds each executor's files; the scratch dir, shuffle and spill files.
RUN ln -s "$(/opt/tidemark/bin/python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark \
 && install -d -o tidemark -g tidemark /home/tidemark/spark-work /home/tidemark/spark-tmp
ENV SPARK_HOME=/opt/spark PATH=/opt/spark/bin:${PATH} PYSPARK_PYTHON=/opt/tidemark/bin/python \
    SPARK_WORKER_DIR=/home/tidemark/spark-work SPARK_LOCAL_DIRS=/home/tidemark/spark-tmp
COPY examples /opt/tidemark/examples
COPY --from=app /opt/tidemark/app /opt/tidemark/app
USER tidemark
WORKDIR /opt/tidemark
LABEL io.tidemark.stage=spark
