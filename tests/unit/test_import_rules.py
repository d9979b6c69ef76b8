"""The import rules of docs/architecture.md ("Import rules"), read from the source files with `ast`.

Each rule has the list of the imports that still break it, written out: a new one fails the test, and so
does a listed one that is gone (the list may only shrink, and says what is left to move).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The source folders and the packages they are installed as (pyproject.toml's package-dir).
PACKAGES = {"broker": "tidemark.broker", "client": "tidemark.client", "spark_connector": "tidemark.spark_connector",
            "proto/tidemark": "tidemark"}

# 1. The protocol adapters (Tidemark v1 servicers, the RocketMQ 5 adapter) reach the broker's domain
#    packages only through the controller's operations, not by importing them.
DOMAIN = ("tidemark.broker.store", "tidemark.broker.offsets", "tidemark.broker.pop", "tidemark.broker.transactions",
          "tidemark.broker.producers")
ADAPTERS_STILL_IMPORTING_DOMAIN = {
    ("broker/services/admin.py", "tidemark.broker.offsets.commits"),
    ("broker/services/convert.py", "tidemark.broker.offsets"),
    ("broker/services/convert.py", "tidemark.broker.store"),
    ("broker/services/messaging.py", "tidemark.broker.producers.service"),
    ("broker/services/messaging.py", "tidemark.broker.transactions.service"),
    ("broker/services/messaging.py", "tidemark.broker.transactions.table"),
    ("broker/services/offsets.py", "tidemark.broker.offsets.commits"),
    ("broker/services/rmq5/convert.py", "tidemark.broker.store"),
    ("broker/services/rmq5/service.py", "tidemark.broker.pop.service"),
    ("broker/services/rmq5/service.py", "tidemark.broker.transactions.service"),
    ("broker/services/rmq5/service.py", "tidemark.broker.transactions.table"),
    ("broker/services/rmq5/status.py", "tidemark.broker.pop.handles"),
    ("broker/services/rmq5/status.py", "tidemark.broker.pop.service"),
}

# 2. The client library speaks gRPC only in client/remoting/.
CLIENT_STILL_IMPORTING_GRPC = {"client/errors.py", "client/producer/attempts.py", "client/health.py"}

# 3. The client never imports the broker, the broker never imports the client; the one exception is
#    the CLI's entry point, whose `broker` and `namesrv` commands start the daemons (imported inside those
#    commands, so the client alone installs and runs without the broker's dependencies).
CLIENT_MODULES_STARTING_DAEMONS = {"client/cli/main.py"}
# 4. proto/ holds the protocol: .proto files, generated code and, until they move, these shared modules.
PROTO_SHARED_MODULES_STILL_THERE = {"auth.py", "fsutil.py", "logs.py", "protocol.py", "records.py", "scheduler.py"}


def sources(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts and "_pb2" not in p.name)


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).as_posix()
    for folder, package in sorted(PACKAGES.items(), key=lambda kv: -len(kv[0])):
        if rel.startswith(folder + "/"):
            parts = rel[len(folder) + 1:].removesuffix(".py").split("/")
            return ".".join([package, *[p for p in parts if p != "__init__"]])
    raise ValueError(rel)


def imports(path: Path) -> set[str]:
    """Every module the file imports, anywhere in it (relative imports resolved)."""
    tree, here, out = ast.parse(path.read_text(), str(path)), module_of(path), set()
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if is_module(f"{base}.{a.name}"))  # `from pkg import mod`
    return out


def is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of the source tree (not a class or a function)."""
    for folder, package in PACKAGES.items():
        if under(name, package):
            rest = name[len(package):].lstrip(".").replace(".", "/")
            base = ROOT / folder / rest if rest else ROOT / folder
            if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
                return True
    return False


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_protocol_adapters_reach_the_domain_only_through_the_controller():
    found = set()
    for path in sources("broker/services"):
        for module in imports(path):
            for domain in DOMAIN:
                if under(module, domain):
                    found.add((path.relative_to(ROOT).as_posix(), module))
    assert found - ADAPTERS_STILL_IMPORTING_DOMAIN == set(), "a protocol adapter imports a domain package"
    assert ADAPTERS_STILL_IMPORTING_DOMAIN - found == set(), "moved away: strike it from the list"


def test_the_client_speaks_grpc_only_in_remoting():
    found = {path.relative_to(ROOT).as_posix() for path in sources("client")
             if not path.relative_to(ROOT).as_posix().startswith("client/remoting/")
             and any(under(m, "grpc") for m in imports(path))}
    assert found - CLIENT_STILL_IMPORTING_GRPC == set(), "client code outside remoting/ imports grpc"
    assert CLIENT_STILL_IMPORTING_GRPC - found == set(), "moved away: strike it from the list"


def test_client_and_broker_do_not_import_each_other():
    for folder, other in (("client", "tidemark.broker"), ("broker", "tidemark.client"),
                          ("spark_connector", "tidemark.broker")):
        offenders = {p.relative_to(ROOT).as_posix() for p in sources(folder) if any(under(m, other) for m in imports(p))}
        assert offenders - CLIENT_MODULES_STARTING_DAEMONS == set(), f"{folder} imports {other}: {sorted(offenders)}"


def test_proto_holds_the_protocol_and_only_the_listed_shared_modules():
    shared = {p.name for p in (ROOT / "proto" / "tidemark").glob("*.py") if p.name != "__init__.py"}
    assert shared - PROTO_SHARED_MODULES_STILL_THERE == set(), "a new shared module in proto/: put it elsewhere"
    assert PROTO_SHARED_MODULES_STILL_THERE - shared == set(), "moved away: strike it from the list"


def test_the_reader_resolves_imports_as_python_does():
    here = ROOT / "broker" / "services" / "rmq5" / "status.py"
    assert module_of(here) == "tidemark.broker.services.rmq5.status"
    assert "tidemark.broker.pop.handles" in imports(here)
