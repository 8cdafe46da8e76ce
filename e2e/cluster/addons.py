#!/usr/bin/env python3
"""The add-ons' command line: offline manifest validation for the tests (what each add-on is, how it is built
and started: ``localcluster/addons/__init__.py``).

``python3 e2e/cluster/addons.py crd-schemas OUT CRD.yaml...`` writes kubeconform schemas for CRDs
(used by the tests for our own CRDs, which change with the code); ``kubeconform-dir`` prints (and
builds if needed) the kubeconform folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

# localcluster/ sits beside this script, and Python puts a script's folder first on sys.path
from localcluster.addons import kubeconform, schemas, support
from localcluster.base import ClusterError, log


def main(argv: list[str]) -> int:
    if argv == ["kubeconform-dir"]:
        try:
            print(kubeconform.kubeconform_dir())
        except ClusterError as e:
            log(f"ERROR: {e}")
            return 1
        return 0
    if len(argv) >= 2 and argv[0] == "crd-schemas":
        yaml = support.pyyaml()
        crds = [d for f in argv[2:] for d in yaml.safe_load_all(Path(f).read_text()) if d]
        print(schemas.write_crd_schemas(crds, Path(argv[1])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
