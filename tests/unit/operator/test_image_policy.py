"""--server-image-prefix matches on image-reference boundaries, not as a plain string prefix (issue #37, item 10)."""

from __future__ import annotations

import pytest
from kubeinfer.operator.servers.image_policy import allowed, full_reference


@pytest.mark.parametrize(
    ("image", "prefixes", "ok"),
    [
        ("anything:1", [], True),  # no list: any image
        ("registry.example.com/ml/server:1.2", ["registry.example.com/ml/"], True),
        ("registry.example.com/ml/server:1.2", ["registry.example.com/ml"], True),
        ("registry.example.com/ml@sha256:" + "a" * 64, ["registry.example.com/ml"], True),
        ("registry.example.com/ml:2", ["registry.example.com/ml"], True),
        ("registry.example.com/ml", ["registry.example.com/ml"], True),
        # what the plain prefix let through
        ("registry.example.com/ml-untrusted/server:1", ["registry.example.com/ml"], False),
        ("registry.example.com.attacker.io/ml/server:1", ["registry.example.com"], False),
        ("registry.example.com:5000/ml/server:1", ["registry.example.com"], False),
        ("registry.example.com/ml/server:1", ["registry.example.com"], True),
        ("localhost:5000/kubeinfer-server:1", ["localhost:5000"], True),
        # Docker Hub short and full names are the same image
        ("kubeinfer/server:1", ["docker.io/kubeinfer/"], True),
        ("docker.io/kubeinfer/server:1", ["kubeinfer/server"], True),
        ("nginx:1", ["docker.io/library/nginx"], True),
        ("nginx:1", ["docker.io/kubeinfer/"], False),
        ("kubeinfer/server-evil:1", ["kubeinfer/server"], False),
        ("", ["registry.example.com"], False),
        ("registry.example.com/ml/x y", ["registry.example.com"], False),
    ],
)
def test_image_prefixes_match_on_reference_boundaries(image: str, prefixes: list[str], ok: bool) -> None:
    assert allowed(image, prefixes) is ok


def test_full_reference_is_what_the_runtime_pulls() -> None:
    assert full_reference("nginx") == "docker.io/library/nginx"
    assert full_reference("team/app:1") == "docker.io/team/app:1"
    assert full_reference("localhost/app") == "localhost/app"
    assert full_reference("quay.io/team/app") == "quay.io/team/app"
