"""server/grpc/rust/patches/apply.py: the patched crates Cargo.toml's [patch.crates-io] points at.

The patch's effect is tested in Rust (server/grpc/rust/tests/h2_patch.rs; patches/canary against the newest h2);
here the bookkeeping: the crate version patched is the one Cargo.lock builds, and a diff applies only where
its context still is.
"""

from __future__ import annotations

import importlib.util
import io
import re
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRATE = ROOT / "server" / "grpc" / "rust"
_spec = importlib.util.spec_from_file_location("kubeinfer_rust_patches", CRATE / "patches" / "apply.py")
assert _spec and _spec.loader
apply = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = apply  # its dataclasses look their module up there
_spec.loader.exec_module(apply)


def _locked(name: str) -> list[str]:
    lock = (CRATE / "Cargo.lock").read_text()
    return re.findall(rf'\[\[package\]\]\nname = "{name}"\nversion = "([^"]+)"', lock)


def test_each_patched_crate_is_the_version_cargo_lock_builds_and_is_patched_in_cargo_toml() -> None:
    manifest = (CRATE / "Cargo.toml").read_text()
    for patch in apply.PATCHES:
        assert _locked(patch.crate) == [patch.version], (patch, _locked(patch.crate))
        assert f'{patch.crate} = {{ path = "patched/{patch.crate}" }}' in manifest
        for diff in patch.diffs:
            assert (CRATE / "patches" / diff).is_file()


def test_a_diff_applies_where_its_context_is_and_refuses_a_changed_file(tmp_path: Path) -> None:
    source = tmp_path / "src" / "a.rs"
    source.parent.mkdir()
    source.write_text("fn a() {\n    one();\n\n    two();\n}\n")
    diff = (
        "--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1,5 +1,6 @@\n fn a() {\n     one();\n+    inserted();\n\n     two();\n }\n"
    )
    apply.apply_diff(tmp_path, diff, "x.patch")
    assert source.read_text() == "fn a() {\n    one();\n    inserted();\n\n    two();\n}\n"
    source.write_text("fn a() {\n    changed();\n}\n")
    with pytest.raises(apply.PatchError, match="x.patch does not apply to src/a.rs: the crate changed there"):
        apply.apply_diff(tmp_path, diff, "x.patch")


def test_the_h2_patch_applies_to_the_published_crate(tmp_path: Path) -> None:
    """Against the .crate file cargo downloaded (skipped when cargo's cache does not have it)."""
    (patch,) = [p for p in apply.PATCHES if p.crate == "h2"]
    data = apply.cached_crate(patch)
    if data is None:
        pytest.skip(f"{patch.crate}-{patch.version}.crate is not in cargo's cache (the first build fetches it)")
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
        tf.extractall(tmp_path)
    root = tmp_path / f"{patch.crate}-{patch.version}"
    before = (root / "src/proto/streams/streams.rs").read_text()
    apply.apply_diff(root, (CRATE / "patches" / patch.diffs[0]).read_text(), patch.diffs[0])
    after = (root / "src/proto/streams/streams.rs").read_text()
    assert "ignoring WINDOW_UPDATE" not in before and "ignoring WINDOW_UPDATE" in after
