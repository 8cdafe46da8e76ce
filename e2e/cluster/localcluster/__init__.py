"""The local Kubernetes cluster of the e2e suite, one job per module (``e2e/cluster/cluster.py`` is its CLI).

Its modules import each other relatively, so the package needs no ``sys.path`` edit under either of its two
names: ``e2e.cluster.localcluster`` from the repository root (``scripts/images`` runs ``python3 -m scripts.images``
there; pytest puts the root on ``sys.path`` too), and ``localcluster`` for the scripts beside it (``cluster.py``,
``addons.py``: Python puts a script's folder first on ``sys.path``). Only the Python standard library (PyYAML for
the add-ons), so the system ``python3`` runs it before any virtual environment exists (``.ci/run``). ``node`` is the
real worker node.
"""
