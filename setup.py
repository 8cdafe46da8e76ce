"""Maps the top-level folders into the ``kubeinfer`` namespace.

``server/`` becomes ``kubeinfer.server`` and ``operator/`` becomes ``kubeinfer.operator``; a plain
``operator`` package would shadow Python's standard library, so neither folder is importable on its own.
Everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {"kubeinfer.server": "server", "kubeinfer.operator": "operator"}

packages = []
package_dir = {}
for name, folder in FOLDERS.items():
    packages.append(name)
    package_dir[name] = folder
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
