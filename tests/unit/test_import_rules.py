"""The import rules of docs/architecture.md ("Import rules"), read from the source files with `ast`.

Each rule has the list of the imports that still break it, written out: a new one fails the test, and so
does a listed one that is gone (the list may only shrink, and says what is left to move).
"""

from __future__ import annotations

import ast
from pathlib import Path

from layout import PACKAGE_FOLDERS

ROOT = Path(__file__).resolve().parents[2]

# The source folders and the packages they are installed as (pyproject.toml's package-dir).
PACKAGES = PACKAGE_FOLDERS

# 1. The protocol adapters (Tidemark v1 servicers, the RocketMQ 5 adapter) reach the broker's domain
#    only through its operations layer (broker/operations.py): they import no domain package, and they use
#    none of the controller's domain managers (`broker.store`, `self._b.pop`, ...).
DOMAIN = ("tidemark.broker.store", "tidemark.broker.offsets", "tidemark.broker.pop", "tidemark.broker.transactions",
          "tidemark.broker.producers", "tidemark.broker.ingest", "tidemark.broker.delivery", "tidemark.broker.cluster")
DOMAIN_MANAGERS = frozenset({"store", "commits", "offsets", "pop", "transactions", "producers", "sender", "puller",
                             "send_back", "queries", "locks", "schedule", "fetch_session", "read_access"})
# Names an adapter calls the controller (or a local alias of it) by.
CONTROLLER_NAMES = frozenset({"_b", "b", "broker", "_broker"})

# 2. The client library speaks gRPC only in client/remoting/ (errors carry a neutral Status).
GRPC_PACKAGES = ("grpc", "grpc_health", "grpc_status", "grpc_reflection")

# 3. The client never imports the broker, the broker never imports the client; the one exception is
#    the CLI's entry point, whose `broker` and `namesrv` commands start the daemons (imported inside those
#    commands, so the client alone installs and runs without the broker's dependencies).
CLIENT_MODULES_STARTING_DAEMONS = {"client/cli/main.py"}
# 6. The broker's domain (its packages but the adapters, the name server and observe/) never reaches up to
#    what assembles and serves it.
TOP_OF_BROKER = ("tidemark.broker.app", "tidemark.broker.server", "tidemark.broker.controller",
                 "tidemark.broker.operations", "tidemark.broker.services", "tidemark.broker.namesrv")
NOT_DOMAIN = ("broker/app.py", "broker/server.py", "broker/controller.py", "broker/operations.py", "broker/services/",
              "broker/namesrv/", "broker/observe/")
# 4. proto/ holds the protocol: .proto files, the generated code, the root package's __init__.py.
# 5. common/ builds on nothing of the broker, the client or the connector.


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
    assert found == set(), "a protocol adapter imports a domain package"


def test_protocol_adapters_use_no_domain_manager_of_the_controller():
    found = set()
    for path in sources("broker/services"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in DOMAIN_MANAGERS and _names_controller(node.value):
                found.add(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} .{node.attr}")
    assert found == set(), "a protocol adapter reaches past the operations layer"


def _names_controller(node: ast.expr) -> bool:
    """`b`, `broker`, `self._b`: the controller as the adapters hold it."""
    if isinstance(node, ast.Name):
        return node.id in CONTROLLER_NAMES
    return isinstance(node, ast.Attribute) and node.attr in CONTROLLER_NAMES


def test_the_broker_domain_never_imports_what_assembles_or_serves_it():
    found = {f"{path.relative_to(ROOT).as_posix()} -> {module}"
             for path in sources("broker") if not path.relative_to(ROOT).as_posix().startswith(NOT_DOMAIN)
             for module in imports(path) if any(under(module, top) for top in TOP_OF_BROKER)}
    assert found == set()


def test_the_client_speaks_grpc_only_in_remoting():
    found = {path.relative_to(ROOT).as_posix() for path in sources("client")
             if not path.relative_to(ROOT).as_posix().startswith("client/remoting/")
             and any(under(m, g) for m in imports(path) for g in GRPC_PACKAGES)}
    assert found == set(), "client code outside remoting/ imports grpc"


def test_client_and_broker_do_not_import_each_other():
    for folder, other in (("client", "tidemark.broker"), ("broker", "tidemark.client"),
                          ("spark_connector", "tidemark.broker")):
        offenders = {p.relative_to(ROOT).as_posix() for p in sources(folder) if any(under(m, other) for m in imports(p))}
        assert offenders - CLIENT_MODULES_STARTING_DAEMONS == set(), f"{folder} imports {other}: {sorted(offenders)}"


def test_proto_holds_the_protocol_and_no_hand_written_module():
    written = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "proto").rglob("*.py")
                     if "_pb2" not in p.name and p.name != "__init__.py")
    assert written == [], "a hand-written module in proto/: shared code goes to common/"


def test_common_builds_on_nothing_of_broker_client_or_connector():
    offenders = {p.relative_to(ROOT).as_posix(): sorted(m for m in imports(p) if under(m, "tidemark")
                                                        and not under(m, "tidemark.common")
                                                        and not under(m, "tidemark.v1"))
                 for p in sources("common")}
    assert {path: found for path, found in offenders.items() if found} == {}


def test_the_reader_resolves_imports_as_python_does():
    here = ROOT / "broker" / "services" / "rmq5" / "service.py"
    assert module_of(here) == "tidemark.broker.services.rmq5.service"
    assert {"tidemark.broker.operations", "tidemark.broker.services.rmq5.convert"} <= imports(here)
