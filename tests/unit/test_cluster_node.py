"""Pure parts of the local cluster's worker node (e2e/cluster/localcluster/node/): addressing and the pause image.

The node itself runs in the e2e suite (e2e/test_node.py, e2e/test_cluster.py)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from e2e.cluster.localcluster.node import network
from e2e.cluster.localcluster.node.pause_image import pause_image

ROOT = Path(__file__).resolve().parents[2]


def test_addresses_of_a_slot_do_not_overlap_other_slots_or_the_kwok_ranges() -> None:
    a, b = network.Net("0123abcd", 7), network.Net("0123abcd", 8)
    assert (a.host_ip, a.node_ip) == ("172.28.7.1", "172.28.7.2")
    assert a.pod_cidr == "10.245.7.0/24" and a.dns_ip == "10.245.7.1"
    assert a.service_cidr == "10.96.7.0/24" and a.service_ip == "10.96.7.1"
    assert {a.pod_cidr, a.service_cidr}.isdisjoint({b.pod_cidr, b.service_cidr})
    assert len(a.host_if) <= 15  # IFNAMSIZ - 1
    assert a.ns_cmd("kubelet", "--v=1")[:3] == ["nsenter", "--net=/run/netns/kubeinfer-0123abcd", "--"]


def test_run_id_is_stable_per_run_folder(tmp_path: Path) -> None:
    assert network.run_id(tmp_path / "a") == network.run_id(tmp_path / "a")
    assert network.run_id(tmp_path / "a") != network.run_id(tmp_path / "b")


def test_pause_image_is_a_deterministic_oci_archive(tmp_path: Path) -> None:
    (tmp_path / "pause").write_bytes(b"\x7fELF fake pause")
    (tmp_path / "pause.version").write_text("3.10.1\n")
    ref, archive = pause_image(tmp_path)
    assert ref == "localhost/kubeinfer/pause:3.10.1"
    assert pause_image(tmp_path)[1] == archive  # same bytes every time: same digest, no re-import
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        files = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}  # type: ignore[union-attr]
    index = json.loads(files["index.json"])
    desc = index["manifests"][0]
    assert desc["annotations"]["io.containerd.image.name"] == ref
    blob = lambda d: files["blobs/sha256/" + d["digest"].removeprefix("sha256:")]  # noqa: E731
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(blob(desc))
    config = json.loads(blob(manifest["config"]))
    assert config["config"] == {"Entrypoint": ["/pause"], "User": "65535:65535"}
    with tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]))) as layer:
        member = layer.getmember("pause")
        assert member.mode == 0o755
        assert layer.extractfile(member).read() == b"\x7fELF fake pause"  # type: ignore[union-attr]
