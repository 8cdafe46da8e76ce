"""Several model repositories served as one (``--model-repository`` repeated, as Triton).

Models are merged across the repositories by folder name. A name found in more than one repository is
not unique: that model is not served (Triton's poll drops it and logs ``failed to poll model '<name>': not
unique across all model repositories``; its index shows it UNAVAILABLE, ``model appears in two or more
repositories``) while every other model serves from the repository that holds it. With one repository
nothing is looked up: every model is in it, as before.

With ``--model-namespacing=true`` (and more than one repository) a model's identity is its repository and
its name, as Triton's ``ModelIdentifier`` {namespace, name} whose namespace is the repository path: the same
name in two repositories is two models, both served. Their routing-table key is their folder's path
(``identifier``); a request naming a model by name reaches the only model of that name, or fails with
Triton's ambiguity text (``ambiguous``) when there are several.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import scan

#: Triton's ``MODEL_READY_REASON_DUPLICATE`` (model_repository_manager.h): the index row of such a model
DUPLICATE_REASON = "model appears in two or more repositories"


def not_unique(name: str) -> str:
    """Triton's log line for a model found in more than one repository (model_repository_manager.cc ``Poll``)."""
    return f"failed to poll model '{name}': not unique across all model repositories"


def ambiguous(name: str, count: int) -> str:
    """Triton's answer to a request naming a model held by several namespaces (model_repository_manager.cc
    ``FindModelIdentifier``, INVALID_ARG)."""
    return (
        f"There are {count} identifiers of model '{name}' in global map, "
        "model namespace must be provided to resolve ambiguity."
    )


def identifier(namespace: Path | str, name: str) -> str:
    """With namespacing, the routing-table key of model ``name`` of repository ``namespace``: its folder's path
    (a model name has no path separator, so it never equals a plain name)."""
    return f"{namespace}/{name}"


def split_identifier(key: str) -> tuple[Path, str]:
    """(repository, name) of an ``identifier``."""
    namespace, _, name = key.rpartition("/")
    return Path(namespace), name


class NotUnique(Exception):
    """The model's folder is in more than one repository."""


@dataclass
class Listing:
    """What one look at every repository found."""

    #: model name → the repository that holds its folder (names found once only)
    where: dict[str, Path] = field(default_factory=dict)
    #: names found in more than one repository
    duplicates: set[str] = field(default_factory=set)
    #: repositories that could not be listed, with why
    unreadable: list[tuple[Path, OSError]] = field(default_factory=list)
    #: with namespacing: ``identifier`` → (repository, name) of every model folder (``where`` and
    #: ``duplicates`` stay empty then: no name is a duplicate)
    namespaced: dict[str, tuple[Path, str]] = field(default_factory=dict)


class RepositorySet:
    """The repositories a server serves, in the order given; ``paths[0]`` is the first (``--model-repository``)."""

    def __init__(self, paths: Sequence[Path], namespacing: bool = False) -> None:
        if not paths:
            raise ValueError("at least one model repository is needed")
        self.paths: tuple[Path, ...] = tuple(paths)
        #: ``--model-namespacing=true`` with several repositories: models are keyed by ``identifier`` (with
        #: one repository every name is unique: nothing changes)
        self.namespacing = namespacing and self.several

    @property
    def first(self) -> Path:
        return self.paths[0]

    @property
    def several(self) -> bool:
        return len(self.paths) > 1

    def holding(self, name: str) -> list[Path]:
        """The repositories with a folder ``name``."""
        return [p for p in self.paths if (p / name).is_dir()]

    def holds(self, name: str) -> bool:
        return any((p / name).is_dir() for p in self.paths)

    def locate(self, name: str) -> Path:
        """The repository holding ``name``'s folder; the first one where none does (a read there finds it
        missing); NotUnique where several do."""
        if not self.several:
            return self.first
        found = self.holding(name)
        if len(found) > 1:
            raise NotUnique(name)
        return found[0] if found else self.first

    def listing(self) -> Listing:
        """Every model folder of every repository (a repository that cannot be listed is reported, not fatal)."""
        out = Listing()
        for path in self.paths:
            try:
                names = scan.model_names(path)
            except OSError as exc:
                out.unreadable.append((path, exc))
                continue
            for name in names:
                if self.namespacing:
                    out.namespaced[identifier(path, name)] = (path, name)
                    continue
                if name in out.duplicates:
                    continue
                if name in out.where:
                    del out.where[name]
                    out.duplicates.add(name)
                else:
                    out.where[name] = path
        return out

    def names(self) -> tuple[list[str], set[str]]:
        """(models found once, models found in several repositories); repositories that cannot be listed skipped."""
        found = self.listing()
        return sorted(found.where), found.duplicates
