"""The pod sandbox ("pause") image, written as an OCI image archive from the pause binary ``build`` compiled."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from ..node import PAUSE_REPO


def pause_image(bins: Path) -> tuple[str, bytes]:
    """An OCI image archive of Kubernetes' pause binary (built from the pinned k8s module by ``build``).

    One uncompressed layer with /pause, entrypoint /pause, user 65535 -- what build/pause/Dockerfile
    makes; assembled here because it needs nothing but the binary. Deterministic bytes (no timestamps),
    so the image digest only changes with the binary."""
    tag = (bins / "pause.version").read_text().strip()
    ref = f"{PAUSE_REPO}:{tag}"

    def tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for name, (data, mode) in files.items():
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode, ti.mtime, ti.uid, ti.gid = len(data), mode, 0, 0, 0
                tf.addfile(ti, io.BytesIO(data))
        return buf.getvalue()

    layer = tar_bytes({"pause": ((bins / "pause").read_bytes(), 0o755)})
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created_by": f"kubeinfer e2e/cluster: Kubernetes build/pause/linux/pause.c ({tag})"}],
        },
        sort_keys=True,
    ).encode()
    blobs = {}

    def desc(media: str, data: bytes, **extra) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data), **extra}

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": desc("application/vnd.oci.image.config.v1+json", config),
            "layers": [desc("application/vnd.oci.image.layer.v1.tar", layer)],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                desc(
                    "application/vnd.oci.image.manifest.v1+json",
                    manifest,
                    platform={"architecture": "amd64", "os": "linux"},
                    annotations={"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag},
                )
            ],
        },
        sort_keys=True,
    ).encode()
    files = {"oci-layout": (b'{"imageLayoutVersion":"1.0.0"}', 0o644), "index.json": (index, 0o644)}
    files.update({f"blobs/sha256/{d}": (data, 0o644) for d, data in blobs.items()})
    return ref, tar_bytes(files)
