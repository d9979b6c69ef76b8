"""Build the broker, Spark and etcd images (`make images`).

    .venv/bin/python tools/images.py [--base IMAGE] [--broker-tag T] [--spark-tag T] [--etcd-tag T]
                                     [--json FILE]

1. A wheelhouse in build/wheels, made here with pip, so a build needs no package index (and no
   certificates) inside the container, and is reproducible:
     app/      the Tidemark wheel (with the generated gRPC code), rebuilt every time but byte for byte
               the same while the sources are (SOURCE_DATE_EPOCH), so Docker's cache still hits;
     broker/   the broker's dependencies, as pip resolves `tidemark[broker]`, and requirements.txt;
     spark/    the Spark worker's, as pip resolves `tidemark[spark]`, and requirements.txt.
   The dependencies are fetched again only when Tidemark's requirements (or this Python) changed since
   the last build (build/wheels/deps.stamp); each image's directory holds its own set and nothing else.
2. The base: --base (or $BASE_IMAGE) if given; else python:3.11-slim when it is present or can be
   pulled; else a local Debian bookworm base, `tidemark-base:bookworm`, made once with debootstrap
   (root and Debian's debootstrap needed) and imported into Docker.
3. `docker build --target broker` and `--target spark` of the Dockerfile, tagged as
   docker-compose.yml names them. The dependencies and Tidemark are separate layers: a code change
   rebuilds only Tidemark's (about 1 MB), and unchanged inputs rebuild nothing.
4. deploy/etcd/Dockerfile: Debian's etcd-server on the same base (controller mode's etcd members),
   from the base's package index, with no build context.
5. No dangling images: the stages the images copy from (app, broker-deps, spark-deps) are Docker's layer
   cache for the next build, so this build's are tagged tidemark/build-cache:STAGE (found by the
   io.tidemark.build label it gives them); then every untagged image with the io.tidemark.stage label, an
   earlier build's stages and the images this one replaced, is removed (`docker image prune`, which spares
   images a container uses, and those made since this build began: another build's, not yet tagged).
   Images without that label are never touched. `docker rmi` of the
   build-cache tags frees their space (about 1.5 GB) at the cost of a full rebuild.

Prints what it does; with --json, writes the images' sizes, packages and build times there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "build" / "wheels"
PUBLIC_BASE = "python:3.11-slim"
LOCAL_BASE = "tidemark-base:bookworm"
BROKER_TAG = "tidemark/broker:0.1.0"
SPARK_TAG = "tidemark/spark:0.1.0"
ETCD_TAG = "tidemark/etcd:0.1.0"
ETCD_DOCKERFILE = ROOT / "deploy" / "etcd" / "Dockerfile"
# The Dockerfile's labels (see its header) and the stages kept as the next build's cache.
STAGE_LABEL, BUILD_LABEL = "io.tidemark.stage", "io.tidemark.build"
CACHE_REPOSITORY = "tidemark/build-cache"
CACHED_STAGES = ("app", "broker-deps", "spark-deps")
# What each image installs. pyproject.toml has no [broker] extra yet: pip then warns and installs the
# base dependencies, which are the broker's today.
IMAGE_EXTRAS = {"broker": "broker", "spark": "spark"}
# The wheels' timestamps: any fixed date gives the same bytes for the same sources (1980: zip's first).
SOURCE_DATE_EPOCH = "315532800"
DEBIAN_MIRROR = os.environ.get("TIDEMARK_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PIP = (sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check")


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


def build_wheelhouse() -> dict[str, list[str]]:
    """Every wheel the images install (see the module docstring); each image's packages, `name==version`."""
    if not list((ROOT / "proto" / "tidemark" / "v1").glob("*_pb2.py")):
        raise ImageError("the gRPC code is not generated: run `make gen` first")
    build_app_wheel()
    stamp = WHEELS / "deps.stamp"
    key = deps_key()
    if stamp.exists() and stamp.read_text() == key and all((WHEELS / i / "requirements.txt").exists()
                                                           for i in IMAGE_EXTRAS):
        print("dependencies unchanged since the last build: wheels kept", flush=True)
    else:
        fetch_dependencies()
        stamp.write_text(key)
    return {image: (WHEELS / image / "requirements.txt").read_text().split() for image in IMAGE_EXTRAS}


def build_app_wheel() -> None:
    """The Tidemark wheel in app/: the same bytes while the sources are the same, so its layer stays cached."""
    app = WHEELS / "app"
    shutil.rmtree(app, ignore_errors=True)
    # setuptools builds in build/lib and keeps what is there: a module deleted from the sources would ship.
    for stale in [ROOT / "build" / "lib", *(ROOT / "build").glob("bdist.*")]:
        shutil.rmtree(stale, ignore_errors=True)
    run([*PIP, "wheel", "--no-deps", *_isolation(), "--wheel-dir", str(app), str(ROOT)], cwd=ROOT,
        env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})


def _isolation() -> list[str]:
    """Build with this venv's setuptools when it has it: no throwaway build env (seconds), and the same
    setuptools every time, so the same bytes."""
    import importlib.util

    return ["--no-build-isolation"] if importlib.util.find_spec("setuptools") and importlib.util.find_spec(
        "wheel") else []


def deps_key() -> str:
    """What the dependency wheels depend on: the requirements the images install (the Tidemark wheel's
    Requires-Dist lines, less other extras': a new test tool keeps the wheels) and the Python they are for."""
    wheel = next((WHEELS / "app").glob("tidemark-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    ours = [f'extra == "{extra}"' for extra in IMAGE_EXTRAS.values()]
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")
                and ("extra ==" not in line or any(marker in line for marker in ours))]
    inputs = [*requires, sys.version, platform.machine(), json.dumps(IMAGE_EXTRAS)]
    return hashlib.sha256("\n".join(inputs).encode()).hexdigest()


def fetch_dependencies() -> None:
    """Wheels of every dependency either image installs (pip's cache makes a refetch quick), then, for each
    image, pip's own resolution of `tidemark[extra]` over them, offline: its wheels and requirements.txt."""
    app_wheel = next((WHEELS / "app").glob("tidemark-*.whl"))
    for old in WHEELS.iterdir():
        if old.is_dir() and old.name != "app":
            shutil.rmtree(old)
    everything = WHEELS / "all"
    extras = ",".join(sorted(set(IMAGE_EXTRAS.values())))
    run([*PIP, "wheel", "--wheel-dir", str(everything), f"tidemark[{extras}] @ {app_wheel.as_uri()}"], cwd=ROOT)
    (everything / app_wheel.name).unlink(missing_ok=True)
    for image, extra in IMAGE_EXTRAS.items():
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            run([*PIP, "install", "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(everything),
                 "--report", str(report), f"tidemark[{extra}] @ {app_wheel.as_uri()}"], cwd=ROOT)
            chosen = json.loads(report.read_text())["install"]
        pins, directory = [], WHEELS / image
        directory.mkdir(parents=True)
        for item in chosen:
            name, version = item["metadata"]["name"], item["metadata"]["version"]
            if name == "tidemark":
                continue
            wheel = everything / Path(item["download_info"]["url"].removeprefix("file://")).name
            os.link(wheel, directory / wheel.name)  # hard links: the Spark wheels are ~500 MB
            pins.append(f"{name}=={version}")
        (directory / "requirements.txt").write_text("\n".join(sorted(pins, key=str.lower)) + "\n")


def build_image(target: str, tag: str, base: str, build_id: str) -> float:
    """docker build of one target, with a context of only what its stages copy (the broker's leaves out
    the Spark wheels and examples), streamed as a tar."""
    started = time.monotonic()
    argv = ["docker", "build", "--quiet", "--target", target, "--tag", tag, "--build-arg", f"BASE_IMAGE={base}",
            "--build-arg", f"BUILD_ID={build_id}", "-"]
    print("+ " + " ".join(argv) + " < context.tar", flush=True)
    build = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        with tarfile.open(fileobj=build.stdin, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            tar.add(ROOT / "Dockerfile", "Dockerfile")
            # The legacy builder runs every stage before --target: the Spark build passes the broker's.
            for part in ("app", "broker", "spark") if target == "spark" else ("app", "broker"):
                tar.add(WHEELS / part, f"build/wheels/{part}")
            if target == "spark":
                tar.add(ROOT / "examples", "examples", filter=_no_caches)
    finally:
        build.stdin.close()
    if build.wait() != 0:
        raise ImageError(f"docker build --target {target} failed (exit {build.returncode})")
    return time.monotonic() - started


def build_etcd_image(tag: str, base: str) -> float:
    """docker build of deploy/etcd/Dockerfile: Debian's etcd on the same base, no context."""
    started = time.monotonic()
    argv = ["docker", "build", "--quiet", "--tag", tag, "--build-arg", f"BASE_IMAGE={base}", "-"]
    print("+ " + " ".join(argv) + f" < {ETCD_DOCKERFILE.relative_to(ROOT)}", flush=True)
    with open(ETCD_DOCKERFILE, "rb") as dockerfile:
        if subprocess.run(argv, stdin=dockerfile, stdout=subprocess.DEVNULL).returncode != 0:
            raise ImageError("docker build of deploy/etcd/Dockerfile failed")
    return time.monotonic() - started


def keep_cache_and_remove_dangling(build_id: str, began: float) -> dict[str, str]:
    """Tag this build's cache stages (step 5 of the module docstring), then remove the untagged images of
    ours made before `began` (epoch seconds); the tags given, stage -> image id."""
    tagged = {}
    for stage in CACHED_STAGES:
        found = subprocess.run(["docker", "images", "--quiet", "--no-trunc", "--filter", f"label={BUILD_LABEL}={build_id}",
                                "--filter", f"label={STAGE_LABEL}={stage}"], capture_output=True, text=True, check=True)
        ids = sorted(set(found.stdout.split()))
        if len(ids) != 1:
            raise ImageError(f"build {build_id} left {len(ids)} images of stage {stage}, not one: {ids}")
        run(["docker", "tag", ids[0], f"{CACHE_REPOSITORY}:{stage}"])
        tagged[stage] = ids[0]
    run(["docker", "image", "prune", "--force", "--filter", f"label={STAGE_LABEL}", "--filter", f"until={int(began)}"],
        stdout=subprocess.DEVNULL)
    return tagged


def _no_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in info.name else info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/images.py", description=__doc__.splitlines()[0])
    p.add_argument("--base", default=os.environ.get("BASE_IMAGE") or None, help="base image (default: see above)")
    p.add_argument("--broker-tag", default=BROKER_TAG)
    p.add_argument("--spark-tag", default=SPARK_TAG)
    p.add_argument("--etcd-tag", default=ETCD_TAG)
    p.add_argument("--json", type=Path, help="write sizes, packages and build times here")
    args = p.parse_args(argv)
    if shutil.which("docker") is None:
        print("images: no docker command (apt-get install docker.io)", file=sys.stderr)
        return 1
    try:
        started = time.monotonic()
        base = choose_base(args.base)
        base_s = time.monotonic() - started
        t = time.monotonic()
        packages = build_wheelhouse()
        wheels_s = time.monotonic() - t
        began = time.time()
        build_id = f"{time.time_ns():x}-{os.getpid()}"
        broker_s = build_image("broker", args.broker_tag, base, build_id)
        spark_s = build_image("spark", args.spark_tag, base, build_id)
        etcd_s = build_etcd_image(args.etcd_tag, base)
        cache = keep_cache_and_remove_dangling(build_id, began)
    except ImageError as e:
        print(f"images: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"images: {' '.join(map(str, e.cmd))} exited with {e.returncode}", file=sys.stderr)
        return 1
    summary = {"base": base, "base_s": round(base_s, 1), "wheels_s": round(wheels_s, 1),
               "cache": {f"{CACHE_REPOSITORY}:{stage}": image for stage, image in cache.items()}}
    for name, tag, build_s in (("broker", args.broker_tag, broker_s), ("spark", args.spark_tag, spark_s),
                               ("etcd", args.etcd_tag, etcd_s)):
        summary[name] = {"tag": tag, "bytes": image_size(tag), "build_s": round(build_s, 1),
                         "packages": packages.get(name, ["etcd-server", "etcd-client"])}
        print(f"{tag}: {summary[name]['bytes'] / 1e6:.0f} MB, built in {build_s:.0f} s (on {base})")
    if args.json:
        args.json.write_text(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
