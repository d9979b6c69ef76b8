"""Build the broker and Spark images (`make images`).

    .venv/bin/python tools/images.py [--base IMAGE] [--broker-tag T] [--spark-tag T] [--json FILE]

1. A wheelhouse in build/wheels: the Tidemark wheel (with the generated gRPC code) and every
   dependency, made here with pip; run/ for the broker image, spark/ for what only Spark needs. The images install from it with --no-index, so a build needs no
   package index (and no certificates) inside the container, and is reproducible.
2. The base: --base (or $BASE_IMAGE) if given; else python:3.11-slim when it is present or can be
   pulled; else a local Debian bookworm base, `tidemark-base:bookworm`, made once with debootstrap
   (root and Debian's debootstrap needed) and imported into Docker.
3. `docker build --target broker` and `--target spark` of the Dockerfile, tagged as
   docker-compose.yml names them.

Prints what it does; with --json, writes the images' sizes and the build times there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "build" / "wheels"
PUBLIC_BASE = "python:3.11-slim"
LOCAL_BASE = "tidemark-base:bookworm"
BROKER_TAG = "tidemark/broker:0.1.0"
SPARK_TAG = "tidemark/spark:0.1.0"
SPARK_ONLY = ("pyspark-", "pyarrow-", "py4j-")  # wheels only the Spark image installs
DEBIAN_MIRROR = os.environ.get("TIDEMARK_DEBIAN_MIRROR", "http://deb.debian.org/debian")


class ImageError(Exception):
    """A step failed; the message says which and why (one line for the caller)."""


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    print("+ " + " ".join(str(a) for a in argv), flush=True)
    return subprocess.run(argv, check=True, **kw)


def have_image(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True).returncode == 0


def image_size(name: str) -> int:
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}}", name],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def choose_base(requested: str | None) -> str:
    """The base image to build on (see the module docstring)."""
    if requested:
        if not have_image(requested) and subprocess.run(["docker", "pull", requested]).returncode != 0:
            raise ImageError(f"base image {requested} is neither present nor pullable")
        return requested
    if have_image(PUBLIC_BASE):
        return PUBLIC_BASE
    pulled = subprocess.run(["docker", "pull", PUBLIC_BASE], capture_output=True, text=True, timeout=300)
    if pulled.returncode == 0:
        return PUBLIC_BASE
    print(f"{PUBLIC_BASE} cannot be pulled ({pulled.stderr.strip().splitlines()[-1:]}); using a local base",
          flush=True)
    if not have_image(LOCAL_BASE):
        make_local_base(LOCAL_BASE)
    return LOCAL_BASE


def make_local_base(name: str) -> None:
    """Debian bookworm minbase with python3 and venv, without apt caches, docs and locales (~125 MB)."""
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise ImageError(f"no base image: {PUBLIC_BASE} cannot be pulled, and making {name} needs root and "
                         f"debootstrap (apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="tidemark-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
             "bookworm", str(rootfs), DEBIAN_MIRROR], stdout=subprocess.DEVNULL)
        for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/doc/*",
                        "usr/share/man/*", "usr/share/info/*"):
            for path in rootfs.glob(pattern):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        for path in (rootfs / "usr/share/locale").iterdir():
            if path.name != "locale.alias":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        run(["docker", "import", "-c", "ENV LANG=C.UTF-8", "-", name], stdin=tar.stdout, stdout=subprocess.DEVNULL)
        if tar.wait() != 0:
            raise ImageError("tar of the base rootfs failed")


def build_wheelhouse() -> None:
    """Every wheel the images install, built or fetched here (pip's cache makes a rebuild quick)."""
    generated = list((ROOT / "proto" / "tidemark" / "v1").glob("*_pb2.py"))
    if not generated:
        raise ImageError("the gRPC code is not generated: run `make gen` first")
    shutil.rmtree(WHEELS, ignore_errors=True)
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--wheel-dir", str(WHEELS / "run"), f"{ROOT}[spark]"], cwd=ROOT)
    (WHEELS / "spark").mkdir()
    for wheel in (WHEELS / "run").glob("*.whl"):
        if wheel.name.lower().startswith(SPARK_ONLY):
            wheel.rename(WHEELS / "spark" / wheel.name)


def build_image(target: str, tag: str, base: str) -> float:
    """docker build of one target, with a context of only what it copies (the broker's leaves out the
    Spark wheels, about 500 MB of the wheelhouse), streamed as a tar."""
    started = time.monotonic()
    argv = ["docker", "build", "--quiet", "--target", target, "--tag", tag, "--build-arg", f"BASE_IMAGE={base}", "-"]
    print("+ " + " ".join(argv) + " < context.tar", flush=True)
    build = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        with tarfile.open(fileobj=build.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            tar.add(ROOT / "Dockerfile", "Dockerfile")
            tar.add(ROOT / "examples", "examples", filter=_no_caches)
            for part in ("run", "spark") if target == "spark" else ("run",):
                tar.add(WHEELS / part, f"build/wheels/{part}")
    finally:
        build.stdin.close()
    if build.wait() != 0:
        raise ImageError(f"docker build --target {target} failed (exit {build.returncode})")
    return time.monotonic() - started


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name else info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/images.py", description=__doc__.splitlines()[0])
    p.add_argument("--base", default=os.environ.get("BASE_IMAGE") or None, help="base image (default: see above)")
    p.add_argument("--broker-tag", default=BROKER_TAG)
    p.add_argument("--spark-tag", default=SPARK_TAG)
    p.add_argument("--json", type=Path, help="write sizes and build times here")
    args = p.parse_args(argv)
    if shutil.which("docker") is None:
        print("images: no docker command (apt-get install docker.io)", file=sys.stderr)
        return 1
    try:
        started = time.monotonic()
        base = choose_base(args.base)
        base_s = time.monotonic() - started
        t = time.monotonic()
        build_wheelhouse()
        wheels_s = time.monotonic() - t
        broker_s = build_image("broker", args.broker_tag, base)
        spark_s = build_image("spark", args.spark_tag, base)
    except ImageError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"images: {' '.join(map(str, e.cmd))} exited with {e.returncode}", file=sys.stderr)
        return 1
    summary = {"base": base, "base_s": round(base_s, 1), "wheels_s": round(wheels_s, 1),
               "broker": {"tag": args.broker_tag, "bytes": image_size(args.broker_tag), "build_s": round(broker_s, 1)},
               "spark": {"tag": args.spark_tag, "bytes": image_size(args.spark_tag), "build_s": round(spark_s, 1)}}
    for name in ("broker", "spark"):
        s = summary[name]
        print(f"{s['tag']}: {s['bytes'] / 1e6:.0f} MB, built in {s['build_s']:.0f} s (on {base})")
    if args.json:
        args.json.write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
