"""The shipped stack in a real container engine: images built as `make images` builds them,
docker-compose.yml brought up as it is, the example pipeline's job run to its exit while the master of
broker-a is killed under it (etcd elects its replica; nobody promotes anything), then a graceful stop and
a second start on the same volumes: two name servers, a three-member etcd, two broker groups of two
brokers in controller mode, Spark and the job. The brokers serve TLS with auth on, from secrets that
tools/dev_secrets.py writes into a temp dir here (TIDEMARK_SECRETS_DIR, mounted read-only); the host
side reaches them through the published ports with the same CA and credentials.

Only the brokers' and Spark UI's ports are published, on 127.0.0.1 at ports Docker picks; the
stack's own traffic stays on the network compose creates. Containers, network and volumes are
removed at the end (the images stay, for the next run).
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tidemark.client import (
    Admin,
    PermissionDeniedError,
    TidemarkError,
    TlsSettings,
    UnauthenticatedError,
)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = f"tidemark-test-{os.getpid()}"
GROUPS = {"broker-a": ("broker-a-1", "broker-a-2"), "broker-b": ("broker-b-1", "broker-b-2")}
BROKERS = tuple(name for pair in GROUPS.values() for name in pair)  # every one publishes its ports
NAMESRVS = ("namesrv-1", "namesrv-2")
ETCDS = ("etcd-1", "etcd-2", "etcd-3")
# Empty: Docker picks the host port (the file publishes on 127.0.0.1 only).
PUBLISH = {name: "" for name in ("BROKER_A1_PORT", "BROKER_A2_PORT", "BROKER_B1_PORT", "BROKER_B2_PORT",
                                 "BROKER_A1_METRICS_PORT", "BROKER_A2_METRICS_PORT", "BROKER_B1_METRICS_PORT",
                                 "BROKER_B2_METRICS_PORT", "SPARK_UI_PORT")}
GROUP, TOPIC = "demo-pipeline", "demo-events"
# Set by the `secrets` fixture: where compose finds the certificates and tidemark.env.
SECRETS_VAR = "TIDEMARK_SECRETS_DIR"
# Set once the stack's job ran on a non-root, read-only worker here: test_compose.py's run of the same stack
# as processes (for machines without an engine) then skips.
STACK_RAN_IN_AN_ENGINE = "TIDEMARK_TEST_COMPOSE_STACK_RAN"

pytestmark = pytest.mark.timeout(1800)


def compose(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(["docker-compose", "--project-name", PROJECT, "--file", str(ROOT / "docker-compose.yml"),
                           *args], cwd=ROOT, env={**os.environ, **PUBLISH}, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"docker-compose {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def docker(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout.strip()


def logs(container_id: str) -> str:
    """A container's output, stdout and stderr together (the broker logs to stderr)."""
    return subprocess.run(["docker", "logs", container_id], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=60).stdout


def container(service: str) -> str:
    """The service's container id, through compose's labels: the docker CLI answers in milliseconds where
    each `docker-compose ps` (compose v1, Python) takes seconds."""
    return docker("ps", "--all", "--quiet", "--filter", f"label=com.docker.compose.project={PROJECT}",
                  "--filter", f"label=com.docker.compose.service={service}")


def state(service: str) -> dict:
    return json.loads(docker("inspect", "--format", "{{json .State}}", container(service)))


def published(service: str, port: int) -> str:
    """host:port where the service's container port is published (on 127.0.0.1, see the compose file)."""
    return docker("port", container(service), f"{port}/tcp").splitlines()[0]


def role(service: str) -> str:
    """MASTER or REPLICA, as the broker says through its published port ("" when it does not answer)."""
    address = published(service, 10911)
    try:
        with Admin(brokers=address, **security()) as admin:
            return admin.broker_status_at(address).role
    except TidemarkError:
        return ""


def masters() -> dict[str, str]:
    """broker name -> the service that is its master now (etcd's choice)."""
    found = {}
    for group, services in GROUPS.items():
        current = [s for s in services if role(s) == "MASTER"]
        assert len(current) == 1, f"{group}: masters {current}"
        found[group] = current[0]
    return found


def brokers_address() -> str:
    return ",".join(published(name, 10911) for name in masters().values())


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.2)


def healthy(service: str) -> bool:
    return state(service).get("Health", {}).get("Status") == "healthy"


def security() -> dict:
    """TLS (the dev CA) and the root credentials from the secrets dir, for clients on the host."""
    directory = Path(PUBLISH[SECRETS_VAR])
    env = dict(line.split("=", 1) for line in (directory / "tidemark.env").read_text().splitlines()
               if line and not line.startswith("#"))
    return {"tls": TlsSettings(ca_file=directory / "ca.pem"),
            "credentials": (env["TIDEMARK_ACCESS_KEY"], (directory / "secret_key").read_text().strip())}


def secrets_dir() -> Path:
    return Path(PUBLISH[SECRETS_VAR])


def snapshot(address: str) -> dict:
    """Topics, every queue's offsets, the group's committed offsets and one message per queue."""
    with Admin(brokers=address, **security()) as admin:
        queues = admin.fetch_message_queues(TOPIC)
        offsets = admin.offsets(queues)
        committed = {(s.queue.broker_name, s.queue.queue_id): s.consumer_offset for s in admin.consume_stats(GROUP)}
        first = {(mq.broker_name, mq.queue_id): admin.view_message(mq, lo).body
                 for mq, (lo, hi) in offsets.items() if hi > lo}
        return {"topics": sorted(admin.list_topics()),
                "offsets": {(mq.broker_name, mq.queue_id): span for mq, span in offsets.items()},
                "committed": committed, "first": first}


@pytest.fixture(scope="module")
def secrets(tmp_path_factory) -> Path:
    """tools/dev_secrets.py into a temp dir, as a user runs it before `docker-compose up` (as root here,
    so broker.key goes to the containers' uid with mode 0400)."""
    directory = tmp_path_factory.mktemp("secrets")
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "dev_secrets.py"), "--dir", str(directory)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    PUBLISH[SECRETS_VAR] = str(directory)
    return directory


@pytest.fixture(scope="module")
def stack(images, secrets):
    """The whole stack up; broker-a's master killed (SIGKILL) once the job has produced its events and
    Spark reads them; the job's exit code and how long it took from `up`; then the killed broker started
    again. The Spark worker must stay up meanwhile: a worker that cannot start (its work dir, say) would
    leave the job waiting for executors until the timeout."""
    started = time.monotonic()
    try:
        compose("up", "--detach", "--no-build")
        job, worker = container("job"), container("spark-worker")
        wait_for(lambda: "produced 2000 events" in logs(job) or not state("job")["Running"], 600,
                 "the job to produce its events")
        killed = masters()["broker-a"]
        docker("kill", "--signal", "KILL", container(killed))
        killed_at = time.monotonic()
        deadline = started + 900
        while (job_state := json.loads(docker("inspect", "--format", "{{json .State}}", job)))["Running"]:
            worker_state = json.loads(docker("inspect", "--format", "{{json .State}}", worker))
            assert worker_state["Running"], f"the Spark worker exited ({worker_state['ExitCode']}):\n{logs(worker)[-4000:]}"
            assert time.monotonic() < deadline, f"the job did not finish in 900 s:\n{logs(job)[-4000:]}"
            time.sleep(1)
        elapsed = time.monotonic() - started
        print(f"\nstack: job exited {job_state['ExitCode']} {elapsed:.0f} s after `up`, "
              f"{time.monotonic() - killed_at:.0f} s after {killed} (broker-a's master) was killed; "
              f"users ran {_span('users')}, the job {_span('job')}")
        docker("start", container(killed))  # it comes back as the new master's replica
        yield {"job_exit": job_state["ExitCode"], "job_s": elapsed, "job_log": logs(job), "killed": killed}
    finally:
        subprocess.run(["docker-compose", "--project-name", PROJECT, "--file", str(ROOT / "docker-compose.yml"),
                        "down", "--volumes", "--remove-orphans", "--timeout", "30"], cwd=ROOT,
                       env={**os.environ, **PUBLISH}, capture_output=True, timeout=300)


def _span(service: str) -> str:
    """When a container started and finished, in seconds after the stack's first container started."""
    def at(stamp: str) -> float:  # Docker's RFC 3339 with up to 9 fraction digits, in UTC
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        return datetime.datetime.fromisoformat(whole).timestamp() + float(f"0.{fraction or 0}")
    first = min(at(state(s)["StartedAt"]) for s in (*NAMESRVS, *ETCDS))
    s = state(service)
    return f"{at(s['StartedAt']) - first:.1f} s .. {at(s['FinishedAt']) - first:.1f} s"


def test_the_job_runs_the_pipeline_and_exits_0(stack):
    assert stack["job_exit"] == 0, stack["job_log"][-5000:]
    assert "total lag 0" in stack["job_log"]


def test_the_group_has_lag_0_across_both_brokers_through_the_published_ports(stack):
    with Admin(brokers=brokers_address(), **security()) as admin:
        stats = admin.consume_stats(GROUP, TOPIC)
    assert {s.queue.broker_name for s in stats} == set(GROUPS), "the topic should span both groups"
    assert sum(s.max_offset for s in stats) == 2000 and sum(s.lag for s in stats) == 0


def test_a_client_without_credentials_is_refused_and_metrics_answer_on_the_published_ports(stack):
    for name in masters().values():
        address = published(name, 10911)
        with pytest.raises(UnauthenticatedError), \
                Admin(brokers=address, tls=security()["tls"], credentials=None) as anonymous:
            anonymous.list_topics()
        metrics = published(name, 9090)
        text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
        assert "tidemark_messages_in_total" in text, f"{name}: no metrics through the published port"


def test_no_secret_is_in_any_containers_environment(stack):
    """`docker inspect` shows a container's environment to whoever may run docker: the secrets are files."""
    directory = secrets_dir()
    secrets = [security()["credentials"][1], (directory / "job_secret_key").read_text().strip(),
               (directory / "peer_user").read_text().strip().partition(":")[2],
               next(line.split()[1] for line in (directory / "spark" / "spark-defaults.conf").read_text().splitlines()
                    if line.startswith("spark.authenticate.secret "))]
    for service in (*NAMESRVS, *ETCDS, *BROKERS, "spark-master", "spark-worker", "users", "job"):
        env = json.loads(docker("inspect", "--format", "{{json .Config.Env}}", container(service)))
        assert not [e for e in env for s in secrets if s in e], f"{service}: a secret in its environment"
    assert any(e.startswith("TIDEMARK_SECRET_KEY_FILE=") for e in json.loads(
        docker("inspect", "--format", "{{json .Config.Env}}", container("job"))))


def test_the_job_ran_on_the_worker_as_non_root_on_a_read_only_root(stack):
    """The executors ran on the worker, as the image's user, with the root file system read-only: Spark
    wrote only into its mounted dirs, which the image made and gave to that user."""
    worker = container("spark-worker")
    config = json.loads(docker("inspect", "--format", "[{{json .Config.User}}, {{json .HostConfig.ReadonlyRootfs}}]",
                               worker))
    assert config[0].split(":")[0] not in ("", "0", "root") and config[1] is True, config
    executors = docker("exec", worker, "sh", "-c", "id -u; cat /home/tidemark/spark-work/app-*/*/stderr")
    uid, _, stderr = executors.partition("\n")
    assert uid == "10001", executors[:500]
    assert "Running task" in stderr and "Finished task" in stderr, stderr[-3000:]
    if stack["job_exit"] == 0:
        # tests/integration/test_compose.py runs the same stack as processes only where this could not run.
        os.environ[STACK_RAN_IN_AN_ENGINE] = "1"


def test_every_service_but_the_job_reports_healthy(stack):
    for name in (*NAMESRVS, *ETCDS, *BROKERS, "spark-master", "spark-worker"):
        wait_for(lambda n=name: healthy(n), 90, f"{name} healthy")


def test_etcd_elected_the_replica_and_the_killed_master_rejoined_as_its_replica(stack):
    """Nobody promoted anything: the killed master's partner was elected by etcd, and the killed broker,
    started again, follows it."""
    killed = stack["killed"]
    partner = next(s for s in GROUPS["broker-a"] if s != killed)
    wait_for(lambda: role(killed) == "REPLICA", 90, f"{killed} back as a replica")
    assert role(partner) == "MASTER"
    assert "event=master_elected" in logs(container(partner))
    assert "event=controller_follow" in logs(container(killed))


def test_each_replica_follows_its_master(stack):
    """Through the name servers inside the stack: replicas registered, caught up, holding the group's offsets."""
    for group, master in masters().items():
        replica = next(s for s in GROUPS[group] if s != master)
        wait_for(lambda r=replica: "event=replication_connected" in logs(container(r)), 90,
                 f"{replica} copying {master}")
        assert "event=replica_connected" in logs(container(master))


def test_the_job_and_the_brokers_own_calls_use_least_privileged_users(stack):
    """Root signs only the `users` service's calls. The job signs as `job` (root's secret is not even mounted
    there, nor in the name servers), the brokers' replication and registrations as `broker` (peer_user); every
    broker has both, neither a super user, each with only its rules; a super-user action by either is refused."""
    assert state("users")["ExitCode"] == 0, logs(container("users"))[-3000:]
    directory = secrets_dir()
    job = json.loads(docker("inspect", "--format", "[{{json .Config.Env}}, {{json .Mounts}}]", container("job")))
    env = dict(e.split("=", 1) for e in job[0])
    assert env["TIDEMARK_ACCESS_KEY"] == "job" and "TIDEMARK_SECRET_KEY" not in env
    assert {Path(m["Source"]).name for m in job[1] if m["Type"] == "bind"} == {
        "ca.pem", Path(env["TIDEMARK_SECRET_KEY_FILE"]).name, "spark"}, "only the job's own secret"
    for namesrv in NAMESRVS:  # what checks registrations needs the brokers' user, not root's key
        mounts = json.loads(docker("inspect", "--format", "{{json .Mounts}}", container(namesrv)))
        assert {Path(m["Source"]).name for m in mounts if m["Type"] == "bind"} == {
            "broker.pem", "broker.key", "ca.pem", "peer_user"}, f"{namesrv}: only the files it reads"
    peer_name, _, peer_secret = (directory / "peer_user").read_text().strip().partition(":")
    envs = json.loads("[" + docker("inspect", "--format", "{{json .Config.Env}},", *map(container, BROKERS))
                      .rstrip(",") + "]")
    assert all("TIDEMARK_PEER_USER_FILE=/run/secrets/tidemark/peer_user" in env for env in envs)
    job_secret = (directory / "job_secret_key").read_text().strip()
    tls = security()["tls"]
    addresses = [published(service, 10911) for service in BROKERS]
    for service, address in zip(BROKERS, addresses, strict=True):  # each keeps its own users: replicas too
        with Admin(brokers=address, **security()) as root:
            users = {u.name: u.super_user for u in root.list_users()}
            rules = {(r.user, r.resource, frozenset(r.actions), r.decision) for r in root.list_acls()}
        assert users == {"root": True, peer_name: False, "job": False}, (service, users)
        assert rules == {(peer_name, "Cluster", frozenset({"Update"}), "Allow"),
                         ("job", f"Topic:{TOPIC}", frozenset({"Pub", "Sub", "Create", "Get"}), "Allow"),
                         ("job", f"Group:{GROUP}", frozenset({"Sub", "Get"}), "Allow")}, (service, rules)
    for name, secret in (("job", job_secret), (peer_name, peer_secret)):  # refused before a role matters
        with Admin(brokers=addresses[0], tls=tls, credentials=(name, secret)) as user:
            with pytest.raises(PermissionDeniedError):
                user.create_user("intruder", "intruder-secret", super_user=True)
            with pytest.raises(PermissionDeniedError):
                user.list_topics()  # List on Cluster: neither may
            with pytest.raises(PermissionDeniedError):
                user.create_topic("not-the-jobs", 1)


# A Spark RPC (RpcRequest: frame length, type 3, request id, body length, body) that is not the authentication
# handshake; run in the worker's container, on the stack's network. A master with spark.authenticate answers it
# with an RpcFailure saying it expected SASL; one without would hand the body to its endpoints.
SPARK_PROBE = """
import socket, struct
body = b"not an auth handshake"
with socket.create_connection(("spark-master", 7077), timeout=10) as s:
    s.sendall(struct.pack(">qbqi", 21 + len(body), 3, 1, len(body)) + body)
    data = b""
    while len(data) < 8 or len(data) < struct.unpack(">q", data[:8])[0]:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
print("type", data[8], data[21:].decode(errors="replace").splitlines()[0])
try:
    socket.create_connection(("spark-master", 6066), timeout=5).close()
    print("rest: open")
except OSError as e:
    print("rest:", type(e).__name__)
"""


def test_spark_master_refuses_unauthenticated_clients_and_rest_submissions(stack):
    """spark.authenticate on the master (and the worker and the job, which did run): a connection's first
    message must be the SASL handshake, and the REST submission server, which takes drivers without any
    secret even then, is off. Master and worker have health checks (their web UIs)."""
    said = docker("exec", container("spark-worker"), "python", "-c", SPARK_PROBE).splitlines()
    assert said[0].startswith("type 5 ") and "Expected SaslMessage" in said[0], said  # 5: RpcFailure
    assert said[1] == "rest: ConnectionRefusedError", said
    for service in ("spark-master", "spark-worker"):
        assert json.loads(docker("inspect", "--format", "{{json .Config.Healthcheck.Test}}", container(service)))


def test_stop_is_graceful_and_a_new_start_keeps_topics_messages_and_offsets(stack):
    with Admin(brokers=brokers_address(), **security()) as admin:  # the rejoined broker holds everything
        wait_for(lambda: all(b.replica_lag_bytes == 0 for b in admin.cluster_list()), 90, "replicas caught up")
    before = snapshot(brokers_address())
    compose("stop", timeout=300)
    tidemark = (*NAMESRVS, *BROKERS)
    for service in (*tidemark, *ETCDS, "spark-master", "spark-worker"):
        s = state(service)
        assert not s["Running"] and not s["OOMKilled"], (service, s)
        # 0: a broker's or etcd's own graceful exit; 143: the JVM's exit on SIGTERM. 137 would be SIGKILL
        # after the grace.
        assert s["ExitCode"] == (143 if service.startswith("spark") else 0), \
            f"{service} exited {s['ExitCode']} ({s}); its last output:\n{logs(container(service))[-4000:]}"
    for name in BROKERS:
        log = logs(container(name))
        assert "event=offsets_flushed" in log and "event=broker_stop" in log, log[-2000:]
    compose("up", "--detach", "--no-build", *BROKERS)
    for name in BROKERS:
        wait_for(lambda n=name: healthy(n), 90, f"{name} healthy again")
    assert snapshot(brokers_address()) == before
