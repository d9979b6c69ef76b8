"""Development secrets for docker-compose.yml: a CA, the brokers' certificate and random secrets.

    .venv/bin/python tools/dev_secrets.py [--dir DIR] [--force] [--owner UID]

Writes into DIR (default $TIDEMARK_SECRETS_DIR, else deploy/secrets), which compose mounts read-only
into the containers; nothing of it goes into an image (.dockerignore admits only build/wheels and
examples):

    ca.pem                  the CA that signed broker.pem; clients trust it (TIDEMARK_TLS_CA_FILE)
    broker.pem, broker.key  one certificate for every broker and name server of docker-compose.yml, localhost,
                            127.0.0.1, ::1
    init_user               root:SECRET, the super user the brokers create on first start
    secret_key              root's SECRET alone, for what signs as root: the `users` service, an operator
    peer_user               broker:SECRET, the brokers' own user (peer_user): replicas sign their calls to
                            their master with it and brokers their registrations, which the name servers
                            take from it alone; it has Update on Cluster (replication, and the
                            cluster's other changes: ACLs have no finer right)
    job_secret_key          the secret of the job's user, `job`, which may only use its topic and group
    spark/spark-defaults.conf  Spark's shared secret (spark.authenticate) for the master, the worker and the
                            job's driver (SPARK_CONF_DIR), and the master's REST submission server off
    tidemark.env            what compose's env_file gives the brokers, name servers and the `users` service:
                            where those files are mounted (TIDEMARK_INIT_USER_FILE, TIDEMARK_PEER_USER_FILE,
                            TIDEMARK_BROKER_USER_FILE, TIDEMARK_SECRET_KEY_FILE) and TIDEMARK_ACCESS_KEY=root;
                            no secret, so `docker inspect` shows none

The `users` service of docker-compose.yml creates `broker` and `job` on every broker with their rules.

The CA's key is not kept: run again with --force for new certificates (and a new secret; a broker
volume that already has users keeps its old root user, so `docker-compose down --volumes` first).
For development only: production certificates come from your own CA and secrets from your store.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "deploy" / "secrets"
BROKER_NAMES = ("broker-a-1", "broker-a-2", "broker-b-1", "broker-b-2", "namesrv-1", "namesrv-2", "localhost")
BROKER_IPS = ("127.0.0.1", "::1")
# The images' user (Dockerfile: useradd --uid 10001): it must be able to read broker.key.
CONTAINER_UID = 10001
VALIDITY = datetime.timedelta(days=365)
# The users docker-compose.yml's `users` service creates on every broker (the root user is init_user's).
PEER_USER, JOB_USER = "broker", "job"
SPARK_CONF = "spark/spark-defaults.conf"
PRIVATE = ("broker.key", "init_user", "secret_key", "peer_user", "job_secret_key", SPARK_CONF)
FILES = ("ca.pem", "broker.pem", "tidemark.env", *PRIVATE)
MOUNTED_AT = "/run/secrets/tidemark"  # where docker-compose.yml mounts the directory


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_certificates() -> tuple[bytes, bytes, bytes]:
    """(ca.pem, broker.pem, broker.key) as PEM; EC P-256 keys."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder()
          .subject_name(_name("tidemark development CA")).issuer_name(_name("tidemark development CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(n) for n in BROKER_NAMES] + [x509.IPAddress(ipaddress.ip_address(i)) for i in BROKER_IPS]
    broker = (x509.CertificateBuilder()
              .subject_name(_name("tidemark broker")).issuer_name(ca.subject)
              .public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + VALIDITY)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return _pem(ca), _pem(broker), key_pem


def env_file(user: str) -> str:
    return (f"# Written by tools/dev_secrets.py. No secret here: each *_FILE names a file of this directory as\n"
            f"# the containers see it ({MOUNTED_AT}). The brokers create the super user on first start and\n"
            f"# sign their own calls as peer_user, the only user the name servers take registrations from;\n"
            f"# clients given this file (the users service) sign as the super user.\n"
            f"TIDEMARK_INIT_USER_FILE={MOUNTED_AT}/init_user\n"
            f"TIDEMARK_PEER_USER_FILE={MOUNTED_AT}/peer_user\n"
            f"TIDEMARK_BROKER_USER_FILE={MOUNTED_AT}/peer_user\n"
            f"TIDEMARK_ACCESS_KEY={user}\n"
            f"TIDEMARK_SECRET_KEY_FILE={MOUNTED_AT}/secret_key\n")


def spark_conf(secret: str) -> str:
    """Spark standalone reads its shared secret from its configuration only (not from a file of its own), so
    the configuration is the secret file. The REST submission server would take jobs without it: off."""
    return ("# Written by tools/dev_secrets.py: the Spark master, worker and job's driver read it (SPARK_CONF_DIR).\n"
            "spark.authenticate true\n"
            f"spark.authenticate.secret {secret}\n"
            "spark.master.rest.enabled false\n"
            "spark.ui.killEnabled false\n")


def _write(path: Path, data: bytes, mode: int) -> None:
    # Created with its final mode, so a secret is never readable by others even for a moment.
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)  # whatever the umask


def write_secrets(directory: Path, *, owner: int | None, user: str = "root") -> str:
    """Write every file into `directory`; returns a note on who can read the private files.

    owner: the uid given the private files (PRIVATE, mode 0400), None to keep the caller's.
    The containers' user must read them: without an owner change they are made readable by every local
    user (0644).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPARK_CONF).parent.mkdir(exist_ok=True)
    ca_pem, broker_pem, key_pem = make_certificates()
    _write(directory / "ca.pem", ca_pem, 0o644)
    _write(directory / "broker.pem", broker_pem, 0o644)
    _write(directory / "tidemark.env", env_file(user).encode(), 0o644)
    secret, peer, job, spark = (secrets.token_urlsafe(24) for _ in range(4))
    private = {"broker.key": key_pem, "init_user": f"{user}:{secret}\n".encode(), "secret_key": f"{secret}\n".encode(),
               "peer_user": f"{PEER_USER}:{peer}\n".encode(), "job_secret_key": f"{job}\n".encode(),
               SPARK_CONF: spark_conf(spark).encode()}
    for name, data in private.items():
        if owner is None:
            _write(directory / name, data, 0o644)
        else:
            _write(directory / name, data, 0o400)
            os.chown(directory / name, owner, -1)
    names = ", ".join(private)
    if owner is None:
        note = (f"{names} are readable by every local user (the containers' uid {CONTAINER_UID} must read them); "
                f"run as root to give them to uid {CONTAINER_UID} with mode 0400 instead")
    else:
        note = f"{names} belong to uid {owner}, mode 0400"
    for path in (directory, (directory / SPARK_CONF).parent):
        os.chmod(path, 0o755)  # the containers' user lists them through the read-only mounts
    return note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("TIDEMARK_SECRETS_DIR") or DEFAULT_DIR),
                        help="where to write (default: $TIDEMARK_SECRETS_DIR, else deploy/secrets)")
    parser.add_argument("--force", action="store_true", help="replace existing files (new CA, certificate, secret)")
    parser.add_argument("--owner", type=int, default=None,
                        help=f"uid to own the private files (default: {CONTAINER_UID} when run as root, else "
                             f"unchanged)")
    args = parser.parse_args(argv)
    present = [name for name in FILES if (args.dir / name).exists()]
    if present and not args.force:
        missing = sorted(set(FILES) - set(present))
        if missing:
            print(f"{args.dir} holds {', '.join(present)} but not {', '.join(missing)}; "
                  f"run with --force to make a new set", file=sys.stderr)
            return 1
        print(f"{args.dir} already holds the development secrets; --force makes new ones")
        return 0
    owner = args.owner if args.owner is not None else (CONTAINER_UID if os.geteuid() == 0 else None)
    note = write_secrets(args.dir, owner=owner)
    print(f"wrote {', '.join(FILES)} to {args.dir}\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
