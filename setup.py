"""Package discovery for the layout in pyproject.toml (all other metadata is there), and the gRPC code.

[tool.setuptools.package-dir] maps the folders broker/, client/, spark_connector/ into the import
package tidemark (tidemark.broker, ...) and proto/ to the root (tidemark, tidemark.v1, ...).
pyproject.toml cannot list packages found under such a mapping, so they are found here, from that
same table: a new subpackage needs no edit. Used by `pip install`, `pip wheel`, `python -m build`
and editable installs (setuptools' finder then maps each root to its folder).

The generated gRPC code (`*_pb2.py`, `*_pb2.pyi`, `*_pb2_grpc.py`) is not in git: `build_py` generates
it from the .proto files when it is missing, as `make gen` does, so a wheel or an install from a fresh
clone or from the sdist carries it (grpcio-tools is a build requirement in pyproject.toml).
"""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
roots = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"]["package-dir"]
packages = []
for name, folder in roots.items():
    found = find_packages(str(ROOT / folder), exclude=["*.tests", "*.tests.*"])
    packages += found if not name else [name, *(f"{name}.{sub}" for sub in found)]

# The protocol packages whose .proto files become Python modules (the Makefile's PROTO_SRC).
PROTO_PACKAGES = ("tidemark/v1", "tidemark/rmq5/v2")


def generate_grpc_code() -> None:
    """protoc when a generated module is missing (a fresh clone, an sdist) or older than its .proto."""
    proto_root = ROOT / "proto"
    sources = [p for pkg in PROTO_PACKAGES for p in sorted((proto_root / pkg).glob("*.proto"))]
    def current(p: Path) -> bool:
        generated = [p.with_name(f"{p.stem}_pb2.py"), p.with_name(f"{p.stem}_pb2_grpc.py")]
        return all(g.exists() and g.stat().st_mtime >= p.stat().st_mtime for g in generated)

    if all(current(p) for p in sources):
        return
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{proto_root}", f"-I{well_known}", f"--python_out={proto_root}",
            f"--pyi_out={proto_root}", f"--grpc_python_out={proto_root}",
            *(str(p.relative_to(proto_root)) for p in sources)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed generating the gRPC code from {', '.join(PROTO_PACKAGES)}")


class BuildPy(build_py):
    def run(self) -> None:
        generate_grpc_code()
        super().run()


setup(packages=sorted(packages), cmdclass={"build_py": BuildPy})
