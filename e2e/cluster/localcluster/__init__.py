"""The local Kubernetes cluster of the e2e suite, one job per module (``e2e/cluster/cluster.py`` is its CLI).

Imported with ``e2e/cluster`` on ``sys.path`` (the CLI, scripts/images.py and tests/support put it there);
only the Python standard library (PyYAML for the add-ons). ``node`` is the real worker node.
"""
