"""docker-compose.yml and the Dockerfile, checked without a container engine.

The compose file is validated against the pinned Compose Specification schema, and every service's
command runs as a plain process with the same arguments and environment, container names and
ports mapped to 127.0.0.1 and free ports: two name servers, a three-member etcd, two broker groups of
two brokers in controller mode (etcd elects each master), a Spark master and worker, and the job. The Spark services run as the file says, as a non-root user
on a read-only root: when the tests run as root they drop to that uid, the install (.venv) stays
root's, and Spark's dirs (the image's SPARK_* variables) are writable only where the file mounts
something; the job's tasks must run on that worker.
As in the file, the brokers serve TLS with auth on, from secrets tools/dev_secrets.py makes at test
time (env_file and read-only mounts mapped to that directory). tests/containers/ runs the same stack
in a real engine where one can run.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pyspark
import pytest
import yaml
from brokerproc import free_port, orphan_safe
from cryptography.hazmat.primitives import serialization
from etcdproc import etcd_binary
from workload import wait_until

from tidemark.client import Admin, TlsSettings, UnauthenticatedError
from tidemark.client.security import credentials_from_env

ROOT = Path(__file__).resolve().parent.parent.parent
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "tests" / "compose" / "compose-spec.json"
SCHEMA_SHA256 = "0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac"
GROUPS = {"broker-a": ("broker-a-1", "broker-a-2"), "broker-b": ("broker-b-1", "broker-b-2")}
BROKERS = tuple(name for pair in GROUPS.values() for name in pair)  # each publishes its ports
NAMESRVS = ("namesrv-1", "namesrv-2")
ETCDS = ("etcd-1", "etcd-2", "etcd-3")
CONTROLLER = "etcd://etcd-1:2379,etcd-2:2379,etcd-3:2379"
SECRETS_VAR = "TIDEMARK_SECRETS_DIR"
# The containers' health probe: standard library only (broker/observe/probe.py).
PROBE = ("python", "-m", "tidemark.broker.observe.probe")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def validator() -> jsonschema.Draft201909Validator:
    return jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))


def test_pinned_schema_is_unchanged():
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == SCHEMA_SHA256


def test_compose_file_is_valid_against_the_compose_specification():
    errors = [e.message for e in validator().iter_errors(compose())]
    assert errors == []
    broken = copy.deepcopy(compose())
    broken["services"]["broker-a-1"]["healthcheck"]["interval"] = 5
    broken["services"]["job"]["depends_on"]["broker-a-1"]["condition"] = "service_ready"
    broken["services"]["broker-b-1"]["comand"] = ["typo"]
    assert len(list(validator().iter_errors(broken))) >= 3, "the validator accepts broken files"


def test_the_stack_has_what_the_pipeline_needs():
    services = compose()["services"]
    assert set(services) == {*NAMESRVS, *ETCDS, *BROKERS, "spark-master", "spark-worker", "users", "job"}
    volumes, host_ports = set(), set()
    for group, pair in GROUPS.items():
        for name in pair:
            s = services[name]
            assert s["build"]["target"] == "broker"
            volumes.add(s["volumes"][0].split(":")[0])
            for p in s["ports"]:
                ip, host_port, _ = p.split(":")
                assert ip == "127.0.0.1", "published on the loopback only"
                host_ports.add(host_port)
            assert s["healthcheck"]["test"] == ["CMD", *PROBE, "http://127.0.0.1:9090/healthz"]
            flags = _flags(s["command"])
            assert f"--advertise-addr={name}:10911" in flags and f"--broker-name={group}" in flags
            assert not any(f.startswith(("--broker-id=", "--master=")) for f in flags), "etcd decides roles"
            assert ("--replication=sync" in flags) == (group == "broker-a"), "broker-a replicates synchronously"
            env = s["environment"]
            assert str(env["TIDEMARK_AUTH"]).lower() in ("1", "true"), "auth on"
            assert env["TIDEMARK_NAMESRV"] == "namesrv-1:9876,namesrv-2:9876"
            assert env["TIDEMARK_CONTROLLER"] == CONTROLLER
            secrets = _secret_mounts(s).values()
            for key in ("TIDEMARK_TLS_CERT", "TIDEMARK_TLS_KEY", "TIDEMARK_TLS_CA_FILE", "TIDEMARK_PEER_TLS_CA"):
                assert any(env[key].startswith(t) for t in secrets), f"{name} {key} is not a mounted secret"
            assert s["env_file"] == f"${{{SECRETS_VAR}-./deploy/secrets}}/tidemark.env", "TIDEMARK_INIT_USER"
            assert env["TIDEMARK_METRICS_HOST"] == "0.0.0.0", "the published metrics port needs it"
            assert {k: v["condition"] for k, v in s["depends_on"].items()} == {
                n: "service_healthy" for n in (*NAMESRVS, *ETCDS)}
    assert len(volumes) == 4 and len(host_ports) == 8, "each broker has its own volume and published ports"
    for name in ETCDS:
        s = services[name]
        assert s["image"] == "tidemark/etcd:0.1.0" and s["build"]["context"] == "deploy/etcd"
        flags = _flags(s["command"])
        assert f"--name={name}" in flags and f"--advertise-client-urls=http://{name}:2379" in flags
        assert s["environment"]["ETCD_INITIAL_CLUSTER"] == ",".join(f"{n}=http://{n}:2380" for n in ETCDS)
        assert s["volumes"] == [f"{name}-data:/var/lib/etcd-data"]
        assert s["healthcheck"]["test"][:2] == ["CMD", "etcdctl"] and "ports" not in s, "etcd stays on the network"
    for name in NAMESRVS:
        s = services[name]
        assert s["entrypoint"] == ["tidemark", "namesrv"] and "--tls-cert=/run/secrets/tidemark/broker.pem" in \
            _flags(s["command"])
        assert s["healthcheck"]["test"] == ["CMD", *PROBE, "tcp://127.0.0.1:9876"]
        assert s["env_file"] == f"${{{SECRETS_VAR}-./deploy/secrets}}/tidemark.env", "TIDEMARK_BROKER_USER"
    for name in ("spark-worker", "job"):  # the job's driver and the worker's executors connect
        assert "/run/secrets/tidemark/ca.pem" in _secret_mounts(services[name]).values(), name
    for name, port in (("spark-master", 8080), ("spark-worker", 8081)):  # their web UIs answer
        assert services[name]["healthcheck"]["test"] == ["CMD", *PROBE, f"http://127.0.0.1:{port}/json/"]
    job = services["job"]
    assert {k: v["condition"] for k, v in job["depends_on"].items()} == {
        **{n: "service_healthy" for n in (*BROKERS, "spark-worker")}, "users": "service_completed_successfully"}
    assert job["environment"]["TIDEMARK_ACCESS_KEY"] == "job", "the job signs as its own user, not root"
    assert "--namesrv=namesrv-1:9876,namesrv-2:9876" in _flags(job["command"])


def test_the_etcd_image_is_debians_etcd_as_a_non_root_user():
    text = (ROOT / "deploy" / "etcd" / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in text and "apt-get install" in text and "etcd-server" in text
    assert "USER 10002:10002" in text and 'VOLUME ["/var/lib/etcd-data"]' in text
    assert 'ENTRYPOINT ["etcd"]' in text and "secret" not in text.lower()


def test_every_service_runs_with_least_privilege_and_leaves_no_anonymous_volume():
    services = compose()["services"]
    for name, s in services.items():
        assert s.get("cap_drop") == ["ALL"], f"{name} keeps capabilities"
        assert "no-new-privileges:true" in s.get("security_opt", []), f"{name} may gain privileges"
        assert s.get("read_only") is True, f"{name}: a read-only root"
        for volume in s.get("volumes", []):
            # `docker-compose down` without -v leaves anonymous volumes behind; named ones are reused.
            assert ":" in volume, f"{name}: anonymous volume {volume}"
    for name in NAMESRVS:  # the image declares VOLUME /data: a tmpfs there keeps Docker from making one
        assert "/data" in _tmpfs(services[name])
    assert "--seed-once" in services["job"]["command"], "a job run again (docker-compose start) adds no events"


def _flags(command: list[str]) -> set[str]:
    return {f"{a}={b}" for a, b in zip(command, command[1:], strict=False) if a.startswith("--")}


def _interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${VAR-default} (the only form the file uses)."""
    return re.sub(r"\$\{(\w+)-([^}]*)\}", lambda m: variables.get(m.group(1), m.group(2)), text)


def _secret_mounts(service: dict) -> dict[str, str]:
    """Read-only bind mounts from the secrets directory: source (as written) -> container path."""
    mounts = {}
    for volume in service.get("volumes", []):
        if ":" not in volume:  # an anonymous volume
            continue
        source, target, *mode = volume.split(":")
        if SECRETS_VAR in source:
            assert mode == ["ro"], f"{volume} must be mounted read-only"
            mounts[source] = target
    return mounts


def test_dockerfile_broker_image():
    text = (ROOT / "Dockerfile").read_text()
    assert "deploy" not in text and "secret" not in text.lower(), "secrets are mounted, never baked in"
    assert (ROOT / ".dockerignore").read_text().split("\n", 1)[1].split() == [
        "*", "!build/wheels", "build/wheels/all", "!examples"]  # all/: every wheel, fetched once for both images
    broker_stage = text.split("FROM runtime AS broker", 1)[1]
    assert "ARG BASE_IMAGE=python:3.11-slim" in text and "--no-index --find-links /wheels" in text
    assert "USER tidemark" in broker_stage and 'VOLUME ["/data"]' in broker_stage
    assert 'HEALTHCHECK' in broker_stage and '"tidemark.broker.observe.probe", "http://127.0.0.1:9090/healthz"' in broker_stage
    assert "ENV TIDEMARK_METRICS_PORT=9090" in broker_stage
    assert 'ENTRYPOINT ["tidemark", "broker"]' in broker_stage and "STOPSIGNAL SIGTERM" in broker_stage
    assert "AS spark" in text and "default-jre-headless" in text


def test_spark_runs_as_non_root_on_a_read_only_root_with_its_dirs_mounted():
    services, image = compose()["services"], dockerfile_env("spark")
    for name in ("spark-master", "spark-worker", "job"):
        s = services[name]
        assert _uid_gid(s) is not None and _uid_gid(s)[0] != 0, f"{name} runs as root"
        assert s.get("read_only") is True, f"{name}: the install must be read-only, as in a locked-down cluster"
        assert "/tmp" in _writable(s), f"{name}: the JVM needs a writable /tmp"
    for name, variables in (("spark-worker", ("SPARK_WORKER_DIR", "SPARK_LOCAL_DIRS")), ("job", ("SPARK_LOCAL_DIRS",))):
        for var in variables:  # a volume: it starts as the image's dir, owned by its user (a tmpfs is root's)
            assert image[var] in _volumes(services[name]), f"{name}: {var}={image[var]} is not a volume"
    assert "install -d -o tidemark -g tidemark /home/tidemark/spark-work /home/tidemark/spark-tmp" in \
        (ROOT / "Dockerfile").read_text(), "the image makes Spark's dirs and gives them to its user"


def dockerfile_env(target: str) -> dict[str, str]:
    """The ENV a Dockerfile stage's containers get: its own and that of the stages it is FROM, unexpanded."""
    stages: dict[str, dict] = {}
    current = None
    for line in re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text()).splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["FROM"]:
            current = stages[words[-1]] = {"from": words[1], "env": {}}
        elif words[:1] == ["ENV"] and current is not None:
            current["env"].update(word.split("=", 1) for word in words[1:])
    env, name = {}, target
    while name in stages:
        env, name = {**stages[name]["env"], **env}, stages[name]["from"]
    return env


def _uid_gid(service: dict) -> tuple[int, int] | None:
    """The numeric `user: uid:gid` of a service (the host may have no such user name)."""
    if "user" not in service:
        return None
    uid, _, gid = str(service["user"]).partition(":")
    return int(uid), int(gid or uid)


def _tmpfs(service: dict) -> list[str]:
    """The container paths of a service's tmpfs mounts (without their options: `/tmp:exec`)."""
    tmpfs = service.get("tmpfs", [])
    return [t.split(":")[0] for t in ([tmpfs] if isinstance(tmpfs, str) else tmpfs)]


def _volumes(service: dict) -> list[str]:
    """The container paths of a service's read-write volumes, named or anonymous."""
    targets = []
    for volume in service.get("volumes", []):
        parts = volume.split(":")
        if parts[-1] != "ro":
            targets.append(parts[1] if len(parts) > 1 else parts[0])
    return targets


def _writable(service: dict) -> list[str]:
    """Container paths a service can write to on a read-only root: its tmpfs and read-write volumes."""
    return [*_tmpfs(service), *_volumes(service)]


class Stack:
    """The compose services as local processes."""

    def __init__(self, tmp: Path, secrets: Path) -> None:
        self.tmp = tmp  # readable by the services' non-root users: their mounts are made in it
        self.variables = {SECRETS_VAR: str(secrets)}
        self.ports = {(name, 10911): free_port() for name in BROKERS}
        self.ports.update({(name, 9876): free_port() for name in NAMESRVS})
        self.ports.update({(name, 9090): free_port() for name in BROKERS})  # metrics, /healthz
        self.ports.update({(name, port): free_port() for name in ETCDS for port in (2379, 2380)})
        self.ports[("spark-master", 7077)] = free_port()
        self.procs: dict[str, subprocess.Popen] = {}

    def translate(self, service: str, args: list[str]) -> list[str]:
        """Container names to 127.0.0.1, container ports to free ports, container paths to temp dirs."""
        mounts = {target: _interpolate(source, self.variables)
                  for source, target in _secret_mounts(compose()["services"][service]).items()}
        out = []
        for i, a in enumerate(args):
            prev = args[i - 1] if i else ""
            for target, source in mounts.items():
                if a.startswith(target):
                    a = source + a[len(target):]
            if prev == "--data-dir":
                a = str(self.tmp / service / "data")
            elif prev == "--checkpoint":
                a = str(self.container_path(service, compose()["services"][service], a))
            elif prev in ("--host", "--driver-host") or a == "0.0.0.0":
                a = "127.0.0.1"
            elif prev == "--metrics-port" and (service, 9090) in self.ports:
                a = str(self.ports[(service, 9090)])
            elif prev in ("--webui-port", "--metrics-port"):
                a = str(free_port())
            elif prev == "--port" and (service, 10911) in self.ports:
                a = str(self.ports[(service, 10911)])
            elif prev == "--port" and (service, 9876) in self.ports:
                a = str(self.ports[(service, 9876)])
            elif prev == "--port" and service == "spark-master":
                a = str(self.ports[("spark-master", 7077)])
            for (name, port), local in self.ports.items():
                a = a.replace(f"{name}:{port}", f"127.0.0.1:{local}")
            out.append(a)
        return out

    def env(self, service: dict, name: str = "") -> dict[str, str]:
        """os.environ, the service's env_file, then its environment; paths in the container's secret
        mounts become the secrets directory's paths, 0.0.0.0 becomes 127.0.0.1 (0.0.0.0:PORT, the
        service `name`'s port mapped)."""
        env = dict(os.environ)
        given = {}
        if "env_file" in service:
            for line in Path(_interpolate(service["env_file"], self.variables)).read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    given[key] = value
        given.update({key: str(value) for key, value in (service.get("environment") or {}).items()})
        mounts = {target: _interpolate(source, self.variables) for source, target in _secret_mounts(service).items()}
        for key, value in given.items():
            value = "127.0.0.1" if value == "0.0.0.0" else value
            for target, source in mounts.items():
                if value.startswith(target):
                    value = source + value[len(target):]
            for (host, port), local in self.ports.items():  # TIDEMARK_NAMESRV names containers
                value = value.replace(f"{host}:{port}", f"127.0.0.1:{local}")
                if host == name:
                    value = value.replace(f"0.0.0.0:{port}", f"127.0.0.1:{local}")
            env[key] = value
        env["PYSPARK_PYTHON"] = sys.executable  # the image sets its own venv's python
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
        return env

    def spark_env(self, name: str, service: dict) -> dict[str, str]:
        """env(), and the Spark image's own SPARK_* dirs, each where the container would find it: in one of
        the service's mounts (a host dir of the service's user), else on the root, read-only if the
        service's is. As in the container, HOME is not writable."""
        env = self.env(service)
        for var, value in dockerfile_env("spark").items():
            if var.startswith("SPARK_") and var != "SPARK_HOME":
                env[var] = ",".join(str(self.container_path(name, service, p)) for p in value.split(","))
        home = self.container_path(name, service, "/home/tidemark")
        home.mkdir(parents=True, exist_ok=True)
        env["HOME"] = str(home)
        return env

    def container_path(self, name: str, service: dict, path: str) -> Path:
        """Where a process of the service finds a container path: under a mount, that mount's host dir,
        made as Docker makes it (a volume: owned by the service's user, as the image makes the dirs the
        file mounts volumes on; a tmpfs: root's, mode 755, but /tmp's 1777); elsewhere, the service's
        root, read-only to its user."""
        for target in _writable(service):
            if path == target or path.startswith(target.rstrip("/") + "/"):
                mount = self.tmp / "mounts" / name / target.strip("/").replace("/", "_")
                if not mount.exists():
                    mount.mkdir(parents=True)
                    if target == "/tmp":
                        mount.chmod(0o1777)
                    elif target in _volumes(service) and os.geteuid() == 0 and _uid_gid(service):
                        os.chown(mount, *_uid_gid(service))
                return mount / path[len(target):].lstrip("/")
        # A read-only root: a root-owned tree nobody else can write to (the container's user cannot either).
        root = self.tmp / "roots" / name
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
        return root / path.lstrip("/")

    def start(self, name: str, argv: list[str], env: dict[str, str], user: tuple[int, int] | None = None
              ) -> subprocess.Popen:
        """The service's command as a process; as `user` (uid, gid) when given and this runs as root."""
        log = open(self.tmp / f"{name}.log", "ab")
        if user is not None and os.geteuid() == 0:
            argv = self.as_user(argv, *user)
        proc = subprocess.Popen(orphan_safe(argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def as_user(self, argv: list[str], uid: int, gid: int) -> list[str]:
        """argv as uid:gid, for whom the install (root's) is read-only, as in the image. The process runs
        in a mount namespace of its own, which gives it what the image gives its user: an /etc/passwd
        entry (the JVM's login needs one) and, where this interpreter lives in a dir only root can enter
        (pyenv in /root, mode 0700), that dir empty but for the interpreter's prefix."""
        prefix = Path(sys.base_prefix).resolve()
        closed = next((d for d in reversed(prefix.parents) if not d.stat().st_mode & 0o001), None)
        keep = self.tmp / "interpreter"
        keep.mkdir(exist_ok=True)
        passwd = self.tmp / "passwd"
        passwd.write_text(Path("/etc/passwd").read_text() + f"tidemark:x:{uid}:{gid}::/home/tidemark:/usr/sbin/nologin\n")
        passwd.chmod(0o644)
        script = """u=$1 g=$2 prefix=$3 closed=$4 keep=$5 passwd=$6; shift 6
            mount --bind "$passwd" /etc/passwd
            if [ -n "$closed" ]; then
                mount --bind "$prefix" "$keep"
                mount -t tmpfs -o mode=0755 tmpfs "$closed"
                mkdir -p "$prefix" && mount --bind "$keep" "$prefix"
            fi
            exec setpriv --reuid="$u" --regid="$g" --clear-groups --pdeathsig keep -- "$@"
        """
        return ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh", str(uid), str(gid),
                str(prefix), str(closed or ""), str(keep), str(passwd), *argv]

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def wait_for_log(self, name: str, text: str, timeout: float) -> None:
        """Until the service's output says `text`; fails at once, with its output, if it has exited."""
        def said() -> bool:
            if text in self.log(name):
                return True
            assert self.procs[name].poll() is None, f"{name} exited {self.procs[name].returncode}:\n{self.log(name)[-4000:]}"
            return False
        wait_until(said, timeout, f"{name} to say {text!r}", interval=0.1, details=lambda: self.log(name)[-2000:])

    def stop(self) -> None:
        for proc in reversed(self.procs.values()):
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def _healthchecks(stack: Stack, names: tuple[str, ...]) -> dict[str, str]:
    """Each service's own compose healthcheck command (the probe), its ports mapped, all at once: the
    output of those that fail (none: all healthy)."""
    services, checks = compose()["services"], {}
    for name in names:
        command = services[name]["healthcheck"]["test"]
        assert command[:4] == ["CMD", *PROBE]
        argv = command[4:]
        for port in (9090, 9876):
            if (name, port) in stack.ports:
                argv = [a.replace(f"127.0.0.1:{port}", f"127.0.0.1:{stack.ports[(name, port)]}") for a in argv]
        checks[name] = subprocess.Popen([sys.executable, *PROBE[1:], *argv], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=stack.env(services[name]))
    outputs = {name: check.communicate(timeout=60)[0] for name, check in checks.items()}
    return {name: out for name, out in outputs.items() if checks[name].returncode != 0}


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def make_secrets(directory: Path) -> Path:
    """tools/dev_secrets.py, as a user runs it before `docker-compose up`."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "dev_secrets.py"), "--dir", str(directory)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def test_dev_secrets_make_a_certificate_for_every_broker_name_and_a_random_root_secret(tmp_path):
    from cryptography import x509

    first, second = make_secrets(tmp_path / "one"), make_secrets(tmp_path / "two")
    cert = x509.load_pem_x509_certificate((first / "broker.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(san.get_values_for_type(x509.DNSName)) | {str(i) for i in san.get_values_for_type(x509.IPAddress)}
    assert {*BROKERS, *NAMESRVS, "localhost", "127.0.0.1"} <= names
    ca = x509.load_pem_x509_certificate((first / "ca.pem").read_bytes())
    cert.verify_directly_issued_by(ca)
    envs = [dict(line.split("=", 1) for line in (d / "tidemark.env").read_text().splitlines()
                 if line and not line.startswith("#")) for d in (first, second)]
    secret = [(d / "secret_key").read_text().strip() for d in (first, second)]
    assert (first / "init_user").read_text().strip() == f"{envs[0]['TIDEMARK_ACCESS_KEY']}:{secret[0]}"
    assert len(secret[0]) >= 24 and secret[0] != secret[1]
    # No secret in what compose puts into the containers' environment: only where the files are mounted.
    assert secret[0] not in (first / "tidemark.env").read_text()
    assert {k: v for k, v in envs[0].items() if k.endswith("_FILE")} == {
        "TIDEMARK_INIT_USER_FILE": "/run/secrets/tidemark/init_user",
        "TIDEMARK_PEER_USER_FILE": "/run/secrets/tidemark/peer_user",
        "TIDEMARK_BROKER_USER_FILE": "/run/secrets/tidemark/peer_user",
        "TIDEMARK_SECRET_KEY_FILE": "/run/secrets/tidemark/secret_key"}
    assert (first / "peer_user").read_text().startswith("broker:"), "the brokers' own calls: not root"
    assert "spark.authenticate true" in (first / "spark" / "spark-defaults.conf").read_text()
    if os.geteuid() == 0:  # given to the containers' user alone
        for name in ("broker.key", "init_user", "secret_key", "peer_user", "job_secret_key",
                     "spark/spark-defaults.conf"):
            st = (first / name).stat()
            assert (st.st_uid, st.st_mode & 0o777) == (10001, 0o400), name
    again = subprocess.run([sys.executable, str(ROOT / "tools" / "dev_secrets.py"), "--dir", str(first)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already" in again.stdout
    assert (first / "broker.pem").read_bytes() == cert.public_bytes(serialization.Encoding.PEM), "kept, not replaced"


@pytest.fixture
def stack_dir():
    """The stack's temp dir, readable by the Spark services' non-root user (pytest's are root's only)."""
    path = Path(tempfile.mkdtemp(prefix="tidemark-compose-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# tests/containers/test_compose_stack.py sets it once it ran this stack in a real engine (it runs first).
STACK_RAN_IN_AN_ENGINE = "TIDEMARK_TEST_COMPOSE_STACK_RAN"


@pytest.mark.spark
def test_compose_services_run_as_processes(stack_dir):
    if os.environ.get(STACK_RAN_IN_AN_ENGINE):
        pytest.skip("tests/containers ran this stack in a real engine this session, the non-root read-only "
                    "Spark worker included")
    services = compose()["services"]
    stack = Stack(stack_dir, make_secrets(stack_dir / "secrets"))
    spark_class = str(Path(os.path.dirname(pyspark.__file__)) / "bin" / "spark-class")
    spark = ("spark-master", "spark-worker")
    try:
        # The JVMs first: they start while the name servers and brokers do (the worker retries its master).
        for name in spark:
            command = stack.translate(name, services[name]["command"])
            assert command[0] == "spark-class"
            stack.start(name, [spark_class, *command[1:]], stack.spark_env(name, services[name]),
                        user=_uid_gid(services[name]))
        for name in NAMESRVS:
            argv = [sys.executable, "-m", "tidemark.client.cli.main", *services[name]["entrypoint"][1:],
                    *stack.translate(name, services[name]["command"])]
            stack.start(name, argv, stack.env(services[name]))
        for name in NAMESRVS:
            stack.wait_for_log(name, "event=namesrv_ready", 60)
            stack.wait_for_log(name, "registrations=signed", 5)  # only the brokers' user may register
        assert _healthchecks(stack, NAMESRVS) == {}, "ready, so healthy by their compose healthchecks"
        for name in ETCDS:  # Debian's etcd, as the image runs it (its data dir from the image's ENV)
            argv = [etcd_binary(), *stack.translate(name, services[name]["command"])]
            env = {**stack.env(services[name], name), "ETCD_DATA_DIR": str(stack_dir / name / "data")}
            stack.start(name, argv, env)
        for name in ETCDS:
            wait_until(lambda n=name: _answers(stack.ports[(n, 2379)]), 60, f"{name} listening")
        for name in BROKERS:
            argv = [sys.executable, "-m", "tidemark.client.cli.main", "broker", *stack.translate(name, services[name]["command"])]
            stack.start(name, argv, stack.env(services[name]))
        for name in BROKERS:
            stack.wait_for_log(name, "event=broker_ready", 60)
        assert _healthchecks(stack, BROKERS) == {}, "ready, so healthy by their compose healthchecks"
        users = services["users"]  # the job's and the brokers' own users, created as root
        assert users["entrypoint"][0] == "python"
        done = subprocess.run([sys.executable, str(ROOT / "deploy" / "compose" / Path(users["entrypoint"][1]).name),
                               *stack.translate("users", users["command"])], cwd=ROOT, env=stack.env(users),
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"users failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        stack.wait_for_log("spark-worker", "Successfully registered with master", 120)
        job_cmd = stack.translate("job", services["job"]["command"])
        assert job_cmd[0] == "python"
        job_argv = [sys.executable, *job_cmd[1:]]
        if os.geteuid() == 0:
            job_argv = stack.as_user(job_argv, *_uid_gid(services["job"]))
        job = subprocess.run(job_argv, cwd=ROOT, env=stack.spark_env("job", services["job"]), capture_output=True,
                             text=True, timeout=600)
        assert job.returncode == 0, (f"job failed:\n{job.stdout[-3000:]}\n{job.stderr[-4000:]}\n"
                                     f"spark-worker:\n{stack.log('spark-worker')[-3000:]}")
        # Its tasks ran on the worker, whose executors wrote only in the worker's dirs, as its user.
        work = stack.container_path("spark-worker", services["spark-worker"], dockerfile_env("spark")["SPARK_WORKER_DIR"])
        executors = sorted(work.glob("app-*/*/stderr"))
        assert executors, f"no executor ran in {work}:\n{stack.log('spark-worker')[-3000:]}"
        said = "".join(p.read_text(errors="replace") for p in executors)
        assert "Running task" in said and "Finished task" in said, said[-3000:]
        if os.geteuid() == 0:
            assert {p.stat().st_uid for p in executors} == {_uid_gid(services["spark-worker"])[0]}
        job_env = stack.env(services["job"])
        tls = TlsSettings(ca_file=job_env["TIDEMARK_TLS_CA_FILE"])
        job_credentials = credentials_from_env(job_env)  # the secret from the file TIDEMARK_SECRET_KEY_FILE names
        assert job_credentials.access_key == "job" and "TIDEMARK_SECRET_KEY" not in job_env
        credentials = credentials_from_env(stack.env(users))  # root's, for what only root may see
        address = {name: f"127.0.0.1:{stack.ports[(name, 10911)]}" for name in BROKERS}
        roles = {}
        for name in BROKERS:
            with Admin(brokers=address[name], tls=tls, credentials=credentials) as one:
                roles[name] = one.broker_status_at(address[name]).role
        masters = {g: next(n for n in pair if roles[n] == "MASTER") for g, pair in GROUPS.items()}
        assert sorted(roles.values()) == ["MASTER", "MASTER", "REPLICA", "REPLICA"], roles
        for name in masters.values():  # one at a time: refused by every broker, a client reports "none reachable"
            with pytest.raises(UnauthenticatedError), \
                    Admin(brokers=address[name], tls=tls, credentials=None) as anonymous:
                anonymous.list_topics()
        with Admin(brokers=",".join(address[n] for n in masters.values()), tls=tls, credentials=credentials) as admin:
            groups = admin.list_groups()
            assert groups, "the job committed no group progress"
            stats = admin.consume_stats(groups[0].group)
        assert {s.queue.broker_name for s in stats} == set(GROUPS), "the topic should span both groups"
        assert sum(s.lag for s in stats) == 0 and sum(s.max_offset for s in stats) > 0
        namesrv = tuple(f"127.0.0.1:{stack.ports[(n, 9876)]}" for n in NAMESRVS)
        with Admin(namesrv=namesrv, tls=tls, credentials=credentials) as admin:
            wait_until(lambda: all(b.replica_lag_bytes == 0 for b in admin.cluster_list()), 30, "replicas caught up")
            members = {(b.broker_name, b.role) for b in admin.cluster_list()}
        assert members == {(g, role) for g in GROUPS for role in ("master", "replica")}
        for group, master in masters.items():  # each replica holds its master's messages and the group's offsets
            replica = next(n for n in GROUPS[group] if n != master)
            with Admin(brokers=address[replica], tls=tls, credentials=credentials) as admin:
                copied = admin.consume_stats(groups[0].group)
            assert [(s.queue, s.max_offset, s.consumer_offset) for s in copied] == [
                (s.queue, s.max_offset, s.consumer_offset) for s in stats if s.queue.broker_name == group]
    finally:
        stack.stop()
