"""Build the kubeinfer container images here and load them into the local cluster's containerd.

``scripts/images`` (``make images``):

1. a Debian bookworm base with python3 and venv, built from Debian packages with mmdebstrap (no
   container registry is reachable here, so no ``python:3.11-slim``), imported as
   ``localhost/kubeinfer-base:bookworm-<hash>``;
2. ``Dockerfile.server`` and ``Dockerfile.operator`` built with buildah on that base (``--build-arg
   BASE=...``; elsewhere ``docker build`` uses their default base), tagged ``kubeinfer-server:<version>``
   and ``kubeinfer-operator:<version>`` (the chart's appVersion) plus ``<version>-<hash>``;
3. each image imported into the containerd of the running local cluster's worker node
   (``e2e/cluster/up``; ``KUBEINFER_CLUSTER_RUN`` picks the run folder), older builds untagged there.

Every step is keyed by a hash of its inputs (the base recipe; the Dockerfile, the base and every source the
package is built from), so an unchanged image is neither rebuilt nor re-imported: a warm run takes seconds.
The package goes into both images as its wheel, built here first (``pip wheel``, setup.py): with cargo on this
host the wheel carries the server's Rust gRPC transport (see ``wheel`` for why here and not in a build stage).
The last two lines printed are the two image references. Options: ``--no-load`` (build only),
``--json`` (print a JSON document instead, for tests). Needs root (buildah, mmdebstrap, containerd).

Images live in buildah's storage (/var/lib/containers); older builds of an image are removed after a
new one (the disk is shared). Environment: ``KUBEINFER_IMAGE_CACHE`` (lock file and scratch space,
default ``~/.cache/kubeinfer-images``), ``KUBEINFER_DEBIAN_MIRROR`` (default ``http://deb.debian.org``),
``KUBEINFER_REQUIRE_GRPC_TRANSPORT=1`` (CI: a server image without the Rust gRPC transport is an error).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

# the local cluster's package (stdlib only), by its path from the repository root: ``scripts/images`` runs this
# file as ``python3 -m scripts.images`` there, so the root is on sys.path (e2e/ and scripts/ are namespace folders)
from e2e.cluster.localcluster import scaffold
from e2e.cluster.localcluster.scaffold import flock

ROOT = Path(__file__).resolve().parents[1]

SYSTEM_PACKAGES = ROOT / "e2e" / "cluster" / "system-packages"

#: What an image is built from, hashed for its tag: what the wheel is built from (setup.py compiles the Rust
#: crate in server/grpc/rust) and what the Dockerfiles' requirements stage reads. README.md (the wheel's long
#: description) is left out, so that doc edits do not rebuild the images.
SOURCES = (
    "pyproject.toml",
    "constraints.txt",
    "setup.py",
    "MANIFEST.in",
    "server",
    "operator",
    "scripts/image_requirements.py",
)
#: The build context the Dockerfiles COPY from (.dockerignore lets only these in): the requirements stage's
#: files and dist/, which holds the one wheel.
CONTEXT = ("pyproject.toml", "constraints.txt", "scripts/image_requirements.py", "dist")
#: What the Dockerfiles' ``deps`` stage (third-party requirements) is built from.
DEPS_CONTEXT = ("pyproject.toml", "constraints.txt", "scripts/image_requirements.py")
IGNORED_PARTS = ("__pycache__",)
IGNORED_SUFFIXES = (".pyc", ".so")
#: cargo's build folder (setup.py builds the crate there; not a source)
IGNORED_DIRS = ("server/grpc/rust/target",)

SUITE = "bookworm"
#: libstdc++6: onnx/onnxruntime/grpcio wheels link it dynamically; netbase: /etc/services, /etc/protocols.
BASE_PACKAGES = ("python3", "python3-venv", "passwd", "ca-certificates", "libstdc++6", "netbase")
#: mmdebstrap arguments of the base; part of its hash, so changing them builds a new base.
BASE_RECIPE = {
    "variant": "essential",  # Essential:yes packages + BASE_PACKAGES: no apt, no perl
    "suite": SUITE,
    "packages": BASE_PACKAGES,
    "dpkg": (
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/locale/*",
        "path-exclude=/usr/share/info/*",
    ),
    "hook": "merged-usr",
    "version": 1,
}
#: --layers: reuse cached steps (the deps stage) when only the sources changed, as docker does
BUILD_FLAGS = ("--network=host", "--layers", "--ulimit=nofile=20000:20000")

IMAGES = {"server": "Dockerfile.server", "operator": "Dockerfile.operator"}
#: Imported in each freshly built image (as its user): a missing system library fails the build, not a pod.
SMOKE = {
    "server": "import kubeinfer.server.cli, onnxruntime, onnx, grpc, fastapi, uvicorn, orjson, numpy",
    "operator": "import kubeinfer.operator.cli, kopf, kubernetes, onnx, httpx, yaml",
}

#: The server's Rust gRPC transport, inside the wheel when cargo built it (CPython's stable ABI: the image's
#: python3, 3.11 or a CUDA base's 3.12, loads it); the image is labelled with whether it carries it.
GRPC_TRANSPORT_FILE = "kubeinfer/server/grpc/kubeinfer_grpc_transport.abi3.so"
GRPC_TRANSPORT_MODULE = "kubeinfer.server.grpc.kubeinfer_grpc_transport"
GRPC_TRANSPORT_LABEL = "io.kubeinfer.grpc-transport"
#: set by CI (.ci/run): a wheel without the transport fails the build (setup.py) instead of serving grpc.aio
REQUIRE_GRPC_TRANSPORT = "KUBEINFER_REQUIRE_GRPC_TRANSPORT"


log = scaffold.progress("kubeinfer-images")


class ImageError(RuntimeError):
    pass


def cache_dir() -> Path:
    return scaffold.cache_folder("KUBEINFER_IMAGE_CACHE", "kubeinfer-images")


def run(*cmd: str, capture: bool = True, **kw) -> str:
    p = subprocess.run(cmd, stdout=subprocess.PIPE if capture else sys.stderr, stderr=subprocess.PIPE, text=True, **kw)
    if p.returncode != 0:
        raise ImageError(f"{' '.join(cmd)} exited {p.returncode}:\n{(p.stdout or '')[-3000:]}{p.stderr[-6000:]}")
    return p.stdout if capture else ""


def project_version() -> str:
    m = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if not m:
        raise ImageError("no version in pyproject.toml")
    return m.group(1)


# ----------------------------------------------------------------------------- hashing


def context_files(root: Path = ROOT, entries: tuple[str, ...] = SOURCES) -> list[Path]:
    files: list[Path] = []
    for entry in entries:
        p = root / entry
        candidates = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in candidates:
            rel = q.relative_to(root)
            if any(part in IGNORED_PARTS for part in rel.parts) or q.suffix in IGNORED_SUFFIXES:
                continue
            if any(rel.is_relative_to(d) for d in IGNORED_DIRS):
                continue
            files.append(rel)
    return files


def inputs_hash(
    dockerfile: str, base_ref: str, build_args: dict[str, str], root: Path = ROOT, entries: tuple[str, ...] = SOURCES
) -> str:
    h = hashlib.sha256()
    for key, value in (("dockerfile", (root / dockerfile).read_bytes()), ("base", base_ref.encode())):
        h.update(f"\0{key}\0".encode() + value)
    h.update(json.dumps(build_args, sort_keys=True).encode())
    h.update((root / ".dockerignore").read_bytes())
    for rel in context_files(root, entries):
        h.update(f"\0{rel}\0{os.stat(root / rel).st_mode & 0o111 != 0}\0".encode())
        h.update((root / rel).read_bytes())
    return h.hexdigest()[:12]


def base_hash() -> str:
    return hashlib.sha256(json.dumps(BASE_RECIPE, sort_keys=True).encode()).hexdigest()[:12]


# ----------------------------------------------------------------------------- the wheel


def wheel(context: Path) -> bool:
    """Build the package's wheel on this host into ``context/dist`` and lay the rest of the build context beside
    it; True when the wheel carries the Rust gRPC transport (its smoke test then imports it).

    Why on the host, not in a build stage of the Dockerfiles: no container registry is reachable here (no
    ``rust:`` image to build FROM), and Debian bookworm's packaged rustc (1.63) is too old for tokio/tonic and
    PyO3. The host is the image's platform: Debian 12 (glibc 2.36); the library is built against CPython's
    stable ABI, so any python3 >= 3.10 loads it; the smoke import in the built image proves both, so a mismatch
    fails the build, not a pod. Without cargo the wheel (and the image) serves gRPC with grpc.aio, unless
    ``KUBEINFER_REQUIRE_GRPC_TRANSPORT=1`` (CI), which makes setup.py fail the build.
    """
    t0 = time.monotonic()
    for entry in DEPS_CONTEXT:
        (context / entry).parent.mkdir(parents=True, exist_ok=True)
        (context / entry).write_bytes((ROOT / entry).read_bytes())
    dist = context / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if proc.returncode != 0:
        raise ImageError(f"pip wheel exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    (built,) = dist.glob("kubeinfer-*.whl")
    with zipfile.ZipFile(built) as zf:
        transport = GRPC_TRANSPORT_FILE in zf.namelist()
    if not transport and os.environ.get(REQUIRE_GRPC_TRANSPORT) == "1":
        raise ImageError(f"{built.name} has no {GRPC_TRANSPORT_FILE} and {REQUIRE_GRPC_TRANSPORT}=1 requires it")
    carries = "with the Rust gRPC transport" if transport else "without the Rust gRPC transport (grpc.aio serves gRPC)"
    log(f"{built.name} built in {time.monotonic() - t0:.1f}s, {carries}")
    return transport


# ----------------------------------------------------------------------------- buildah


def image_exists(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True).returncode == 0


def image_size(ref: str) -> int:
    """Uncompressed size of the image's layers in bytes (what it occupies unpacked on a node)."""
    manifest = json.loads(json.loads(run("buildah", "inspect", "--type", "image", ref))["Manifest"])
    return sum(int(layer["size"]) for layer in manifest["layers"])  # local layers are stored uncompressed


def build_base() -> str:
    ref = f"localhost/kubeinfer-base:{SUITE}-{base_hash()}"
    if image_exists(ref):
        return ref
    mirror = os.environ.get("KUBEINFER_DEBIAN_MIRROR", "http://deb.debian.org").rstrip("/")
    sources = [
        f"deb {mirror}/debian {SUITE} main",
        f"deb {mirror}/debian {SUITE}-updates main",
        f"deb {mirror}/debian-security {SUITE}-security main",
    ]
    log(f"building the Debian base {ref} with mmdebstrap (about a minute)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubeinfer-base-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        cmd = [
            "mmdebstrap",
            f"--variant={BASE_RECIPE['variant']}",
            "--mode=root",
            "--format=tar",
            f"--hook-dir=/usr/share/mmdebstrap/hooks/{BASE_RECIPE['hook']}",
            "--include=" + ",".join(BASE_PACKAGES),
            "--aptopt=Acquire::Retries 3",
            *(f"--dpkgopt={o}" for o in BASE_RECIPE["dpkg"]),
            SUITE,
            str(tar),
            *sources,
        ]
        run(*cmd)
        ctr = run("buildah", "from", "scratch").strip()
        try:
            mnt = run("buildah", "mount", ctr).strip()
            run("tar", "-xf", str(tar), "-C", mnt, "--numeric-owner")
            run("buildah", "umount", ctr)
            run(
                "buildah",
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "/bin/bash",
                "--label",
                f"io.kubeinfer.base-recipe={base_hash()}",
                "--label",
                f"org.opencontainers.image.description=Debian {SUITE} + {' '.join(BASE_PACKAGES)} (mmdebstrap)",
                ctr,
            )
            run("buildah", "commit", "-q", "--rm", ctr, ref)
        except BaseException:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)
            raise
    log(f"base {ref}: {image_size(ref) / 1e6:.0f} MB, built in {time.monotonic() - t0:.0f}s")
    for line in run("buildah", "images", "--format", "{{.Name}}:{{.Tag}}").split():
        if line.startswith("localhost/kubeinfer-base:") and line != ref:
            subprocess.run(["buildah", "rmi", line], capture_output=True)  # fails (kept) while still in use
    return ref


def host_ca_volume() -> list[str]:
    """Lend the build's RUN steps this machine's CA bundle (not committed to the image): where egress to
    PyPI goes through a TLS-inspecting proxy, pip in the Debian base trusts the system bundle, not certifi."""
    bundle = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    return [f"--volume={bundle}:/etc/ssl/certs/ca-certificates.crt:ro"] if bundle.is_file() else []


class Context:
    """The build context of both images, in a folder of its own: laid (with the wheel built) on first need."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.transport: bool | None = None

    def ready(self) -> bool:
        """Builds the wheel the first time; True when it carries the Rust gRPC transport."""
        if self.transport is None:
            self.transport = wheel(self.folder)
        return self.transport


def build_image(role: str, base: str, extra_args: dict[str, str], context: Context) -> dict:
    version = project_version()
    dockerfile = IMAGES[role]
    args = {"BASE": base, **extra_args}
    digest = inputs_hash(dockerfile, base, args)
    name = f"kubeinfer-{role}"
    local = f"localhost/{name}:{version}-{digest}"
    built = False
    t0 = time.monotonic()
    if not image_exists(local):
        transport = context.ready()
        log(f"building {name} ({dockerfile}, inputs {digest})")
        flags = [*BUILD_FLAGS, "-f", str(ROOT / dockerfile), *host_ca_volume()]
        for k, v in args.items():
            flags += ["--build-arg", f"{k}={v}"]
        # the requirements stage under its own tag, so pruning never drops that cache
        deps = f"localhost/{name}-deps:{inputs_hash(dockerfile, base, args, entries=DEPS_CONTEXT)}"
        folder = str(context.folder)
        if not image_exists(deps):
            run("buildah", "bud", "-q", *flags, "--target", "deps", "-t", deps, folder)
        label = f"--label={GRPC_TRANSPORT_LABEL}={int(transport)}"
        run("buildah", "bud", "-q", *flags, label, "-t", local, "-t", f"localhost/{name}:{version}", folder)
        smoke(local, SMOKE[role] + (f", {GRPC_TRANSPORT_MODULE}" if transport and role == "server" else ""))
        built = True
        prune(name, keep=(local, deps))
    else:
        run("buildah", "tag", local, f"localhost/{name}:{version}")
    info = {
        "role": role,
        "ref": f"{name}:{version}",
        "hash_ref": f"{name}:{version}-{digest}",
        "local_ref": local,
        "hash": digest,
        "built": built,
        "seconds": round(time.monotonic() - t0, 1),
        "size_bytes": image_size(local),
        "grpc_transport": image_label(local, GRPC_TRANSPORT_LABEL) == "1",
    }
    log(
        f"{info['ref']} ({'built' if built else 'cached'} in {info['seconds']}s): "
        f"{info['size_bytes'] / 1e6:.0f} MB unpacked"
    )
    return info


def image_label(ref: str, label: str) -> str | None:
    config = json.loads(run("buildah", "inspect", "--type", "image", ref))
    return ((config.get("OCIv1") or {}).get("config") or {}).get("Labels", {}).get(label)


def smoke(ref: str, code: str) -> None:
    ctr = run("buildah", "from", "--pull=never", ref).strip()
    try:
        run("buildah", "run", "--network=none", ctr, "--", "python3", "-c", code)
    except ImageError as e:
        subprocess.run(["buildah", "rmi", ref], capture_output=True)
        raise ImageError(f"{ref} cannot import what it needs: {e}") from e
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)


#: builds of an image kept besides the current one: other worktrees and CI runs on this machine share
#: buildah's storage, and pruning their fresh builds made them rebuild identical inputs
KEEP_BUILDS = 4
KEEP_SECONDS = 6 * 3600


def prune(name: str, keep: tuple[str, ...]) -> None:
    """Drop this image's old builds and requirement stages (older than KEEP_SECONDS and beyond the KEEP_BUILDS
    newest) and the dangling build steps: the disk is shared and tight."""
    old = re.compile(rf"localhost/{name}(:[^:]+-|-deps:)[0-9a-f]{{12}}")
    builds: dict[bool, list[tuple[int, str]]] = {True: [], False: []}  # by "is a deps stage"
    for image in json.loads(run("buildah", "images", "--json") or "[]"):
        for ref in image.get("names") or []:
            if ref not in keep and old.fullmatch(ref):
                builds["-deps:" in ref].append((int(image.get("created", 0)), ref))
    now = time.time()
    for refs in builds.values():
        for i, (created, ref) in enumerate(sorted(refs, reverse=True)):
            if i >= KEEP_BUILDS or now - created > KEEP_SECONDS:
                subprocess.run(["buildah", "rmi", ref], capture_output=True)
    subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)


# ----------------------------------------------------------------------------- containerd


def cluster_node() -> dict | None:
    """The worker node of the running local cluster (from its run folder's state.json), if any."""
    from e2e.cluster.localcluster.base import run_dir
    from e2e.cluster.localcluster.state import load_state
    from e2e.cluster.localcluster.supervisor import healthy

    state = load_state(run_dir())
    if not state or not state.get("node") or not healthy(state, patience=5):
        return None
    return state["node"]


def ctr(node: dict, *args: str) -> str:
    return run("ctr", "--address", node["containerd_socket"], "--namespace", "k8s.io", *args)


def normalized(ref: str) -> str:
    """The name containerd (and the kubelet) use for a short docker reference."""
    return ref if "/" in ref.split(":")[0] else f"docker.io/library/{ref}"


def load(node: dict, info: dict) -> bool:
    """Import the image unless containerd already has this exact build; returns True when imported."""
    present = set(ctr(node, "images", "ls", "-q").split())
    want, by_hash = normalized(info["ref"]), normalized(info["hash_ref"])
    if by_hash in present:
        if want not in present or image_target(node, want) != image_target(node, by_hash):
            ctr(node, "images", "tag", "--force", by_hash, want)
        return False
    with tempfile.TemporaryDirectory(prefix="kubeinfer-image-", dir=cache_dir()) as tmp:
        archive = Path(tmp) / "image.tar"
        run("buildah", "push", "-q", info["local_ref"], f"docker-archive:{archive}:{info['ref']}")
        ctr(node, "images", "import", str(archive))
    ctr(node, "images", "tag", "--force", want, by_hash)
    # earlier builds of this image: every reference to them goes, and containerd's GC runs now (--sync: its
    # default schedule waits for 100 changes, so untagged layers stayed on disk for days)
    stale = stale_refs(image_rows(node), info["ref"], image_target(node, want))
    if stale:
        ctr(node, "images", "rm", "--sync", *stale)
    return True


def image_rows(node: dict) -> list[tuple[str, str]]:
    """(reference, target digest) of every image the node's containerd holds."""
    rows = []
    for line in ctr(node, "images", "ls").splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 3:
            rows.append((cols[0], cols[2]))
    return rows


def image_target(node: dict, ref: str) -> str:
    return next((target for name, target in image_rows(node) if name == ref), "")


def stale_refs(rows: list[tuple[str, str]], ref: str, current: str) -> list[str]:
    """The references that keep earlier builds of ``ref`` (``name:version``) alive in containerd: their tags,
    however they were named (``docker.io/library/`` or buildah's ``localhost/``, with or without the inputs
    hash), and the CRI plugin's own records of them (``sha256:<image id>``, one per image the kubelet saw),
    which pin the layers after every tag is gone. Nothing else: another image, or the build at ``current``
    (its target digest), is never listed."""
    repository, _, version = ref.partition(":")
    ours = re.compile(
        rf"(?:docker\.io/library/|localhost/)?{re.escape(repository)}:{re.escape(version)}(?:-[0-9a-f]{{12}})?"
    )
    stale = [name for name, target in rows if target != current and ours.fullmatch(name)]
    named = {target for name, target in rows if not name.startswith("sha256:") and name not in stale}
    records = [name for name, target in rows if name.startswith("sha256:") and target not in named]
    return stale + records


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-load", action="store_true", help="build only; do not import into the cluster's containerd")
    ap.add_argument("--json", action="store_true", help="print a JSON document instead of the two references")
    ap.add_argument("--server-extras", default="", help="EXTRAS build argument of the server image (e.g. gpu)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        log("needs root (buildah, mmdebstrap and containerd here run as root)")
        return 1
    t0 = time.monotonic()
    try:
        subprocess.run([str(SYSTEM_PACKAGES)], check=True)
        cache_dir().mkdir(parents=True, exist_ok=True)
        with flock(cache_dir() / ".build.lock"):
            base = build_base()
            with tempfile.TemporaryDirectory(prefix="kubeinfer-context-", dir=cache_dir()) as tmp:
                context = Context(Path(tmp))
                images = [
                    build_image("server", base, {"EXTRAS": args.server_extras}, context),
                    build_image("operator", base, {}, context),
                ]
        loaded_into = None
        if not args.no_load:
            node = cluster_node()
            if node is None:
                log("no running local cluster with a worker node: images built, not loaded (run e2e/cluster/up first)")
            else:
                for info in images:
                    t1 = time.monotonic()
                    info["imported"] = load(node, info)
                    if info["imported"]:
                        log(f"imported {info['ref']} into {node['name']} in {time.monotonic() - t1:.1f}s")
                loaded_into = node["name"]
    except (ImageError, subprocess.CalledProcessError) as e:
        log(f"ERROR: {e}")
        return 1
    total = time.monotonic() - t0
    log(f"done in {total:.1f}s")
    if args.json:
        print(json.dumps({"base": base, "images": images, "node": loaded_into, "seconds": round(total, 1)}, indent=2))
    else:
        for info in images:
            print(info["ref"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
