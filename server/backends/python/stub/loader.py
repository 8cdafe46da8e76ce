"""Imports a model's ``model.py`` the way Triton's stub does, once per instance, in one shared process.

Triton (seen with 2.51) imports ``model.py`` as module ``<version>.model`` with ``<model>/<version>`` and
``<model>`` appended to ``sys.path``, so a model may ``import helper`` (a sibling file or package),
``from . import helper`` and ``from helpers.sub import x``; each instance is its own process, so module
state is per instance. Here:

* the version folder becomes a private package per instance (``_kubeinfer_model_<n>``), and ``model.py``
  is its ``model`` module, so relative imports resolve inside that instance's package;
* absolute imports of names that Python's own path finder does not find (``sys.path`` first, as Triton
  appends the model folders at its end) are looked up in the instance's version and model folders by a
  finder placed last on ``sys.meta_path``. What it loads belongs to the instance: it is kept out of
  ``sys.modules`` between calls (so another model's ``helper`` is a different module) and handed back
  to the instance on its next import.

The running instance is the one marked on the current thread (``context.running``). Loading is
serialised; a model importing a sibling lazily from two instances at the very same moment may see the
other's copy for that one import (Triton's processes cannot). In a stub process there is one instance,
and the same rules hold.

Stub-safe (standard library and numpy only): see ``context``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any


class ModelLoadError(ValueError):
    """``model.py`` is missing, fails to import or defines no ``TritonPythonModel`` (a load failure)."""


_ids = itertools.count()
_load_lock = threading.RLock()
_local = threading.local()


class ModelModule:
    """One instance's import of ``model.py`` and of the sibling modules it uses."""

    def __init__(self, model_file: Path, label: str, code: bytes | None = None) -> None:
        """``code``: model.py's bytes as the server read them, once, through the model folder's descriptor
        (``repository.model_files``), so that a file swapped after that read is not what runs; None reads
        ``model_file`` (tests, tools)."""
        self.version_dir = model_file.parent
        self.search = [self.version_dir, self.version_dir.parent]
        self.package = f"_kubeinfer_model_{next(_ids)}"
        #: sibling modules this instance imported by absolute name (``helper``, ``helpers.sub``)
        self.siblings: dict[str, ModuleType] = {}
        self._owned: set[str] = set()  # top-level sibling names
        self._dirty = False  # a sibling was imported during this call: take it out of sys.modules
        _install_finders()
        if code is None:  # the server hands over what it read through the model folder's descriptor
            try:
                code = model_file.read_bytes()
            except (FileNotFoundError, IsADirectoryError):
                raise ModelLoadError(f"python model file {model_file} not found") from None
        with _load_lock, self.active():
            package = ModuleType(self.package)
            package.__path__ = [str(self.version_dir)]
            package.__package__ = self.package
            package.__spec__ = importlib.machinery.ModuleSpec(self.package, None, is_package=True)
            package.__spec__.submodule_search_locations = [str(self.version_dir)]
            sys.modules[self.package] = package
            spec = importlib.util.spec_from_file_location(
                f"{self.package}.model", model_file, loader=_Source(f"{self.package}.model", model_file, code)
            )
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # SyntaxError, ImportError, anything model.py raises at import
                self.unload()
                raise ModelLoadError(
                    f"{label}: importing {model_file.name} failed: {type(exc).__name__}: {exc}"
                ) from None
        self.module = module
        cls = getattr(module, "TritonPythonModel", None)
        if not isinstance(cls, type):
            self.unload()
            raise ModelLoadError(f"{label}: {model_file.name} defines no class TritonPythonModel")
        self.model_class: type = cls

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run model code: this instance's siblings resolve for absolute imports, and leave after."""
        outer = getattr(_local, "module", None)
        _local.module = self
        try:
            yield
        finally:
            _local.module = outer
            if self._dirty:
                self._evict()

    def _evict(self) -> None:
        self._dirty = False
        for name in list(sys.modules):
            top = name.partition(".")[0]
            if top in self._owned:
                module = sys.modules.pop(name, None)  # None: another thread took it out meanwhile
                if module is not None:
                    self.siblings[name] = module

    def find(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """A spec for ``fullname`` if it is (or may become) one of this instance's siblings."""
        self._dirty = True
        cached = self.siblings.get(fullname)
        if cached is not None:
            return importlib.util.spec_from_loader(fullname, _Cached(cached), origin=getattr(cached, "__file__", None))
        if "." in fullname:
            return None  # submodules of a sibling package resolve through its __path__
        for folder in self.search:
            package_init = folder / fullname / "__init__.py"
            source = folder / f"{fullname}.py"
            if package_init.is_file():
                spec = importlib.util.spec_from_file_location(
                    fullname, package_init, submodule_search_locations=[str(folder / fullname)]
                )
            elif source.is_file():
                spec = importlib.util.spec_from_file_location(fullname, source)
            else:
                continue
            self._owned.add(fullname)
            return spec
        return None

    def unload(self) -> None:
        """Forget every module of this instance (its package, ``model``, relative imports)."""
        prefix = self.package + "."
        # list() copies the keys in one step: another model's load thread may be importing meanwhile, and
        # iterating sys.modules itself then failed with "dictionary changed size during iteration"
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(prefix)]:
            sys.modules.pop(name, None)
        self.siblings.clear()


def enter_module(module: ModelModule) -> None:
    """``module``'s siblings resolve on this thread for the rest of its life (an instance's own loop thread)."""
    _local.module = module


class _Source(importlib.abc.Loader):
    """Runs source already read (``model.py``), naming its real path in tracebacks and ``__file__``; writes
    no bytecode cache into the repository."""

    def __init__(self, fullname: str, path: Path, code: bytes) -> None:
        self.fullname, self.path, self.code = fullname, path, code

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        exec(compile(self.code, str(self.path), "exec", dont_inherit=True), module.__dict__)

    def get_source(self, fullname: str) -> str:
        return self.code.decode("utf-8", "replace")


class _Cached(importlib.abc.Loader):
    """Hands an instance's already imported sibling back (module state survives between calls)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        pass


class _CachedFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: an instance's own sibling modules, before anything else."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        module = getattr(_local, "module", None)
        if module is None or fullname not in module.siblings:
            return None
        spec: importlib.machinery.ModuleSpec | None = module.find(fullname)
        return spec


class _SiblingFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: names nothing on ``sys.path`` has, from the running instance's folders."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        module = getattr(_local, "module", None)
        if module is None or path is not None:
            return None
        spec: importlib.machinery.ModuleSpec | None = module.find(fullname)
        return spec


_installed = False


def _install_finders() -> None:
    global _installed
    with _load_lock:
        if not _installed:
            sys.meta_path.insert(0, _CachedFinder())
            sys.meta_path.append(_SiblingFinder())
            _installed = True
