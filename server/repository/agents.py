"""Repository agents: code the config's ``model_repository_agents`` section runs on a model's files around its load.

Triton's agents are shared libraries behind the ``TRITONREPOAGENT`` C API; here an agent is a Python object
with Triton's lifecycle: ``LOAD`` before the model loads (an error fails the load with the agent's words),
then ``LOAD_COMPLETE`` or ``LOAD_FAIL``, and ``UNLOAD`` / ``UNLOAD_COMPLETE`` when the loaded model is replaced
or unloaded; the completion actions run in reverse order of the agents, as Triton runs them. An agent sees
the model's folder and the parameters its config entry gives it; it may check the files, not move them
(Triton's ``TRITONREPOAGENT_ModelRepositoryUpdate`` and mutable locations have no counterpart).

Built in: ``checksum``, Triton's checksum agent (``MD5:<path relative to the model folder>`` → the file's
expected MD5 hex digest), with its error texts. More agents come as Python packages through the
``kubeinfer.repository_agents`` entry-point group (an object or class with ``model_action``). A name neither
provides fails the load as Triton fails it when no ``libtritonrepoagent_<name>.so`` is in
``--repoagent-directory``.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Protocol

from ..config import pb
from .layout import PathEscape
from .model_files import ModelFolder

log = logging.getLogger(__name__)

#: Triton's default ``--repoagent-directory`` (only named in the message for an agent that is not found)
DEFAULT_DIRECTORY = "/opt/tritonserver/repoagents"
#: the entry-point group third-party agents register under
ENTRY_POINT_GROUP = "kubeinfer.repository_agents"
_READ_BLOCK = 1 << 20


class AgentAction(enum.Enum):
    """Triton's ``TRITONREPOAGENT_ActionType`` values."""

    LOAD = "TRITONREPOAGENT_ACTION_LOAD"
    LOAD_COMPLETE = "TRITONREPOAGENT_ACTION_LOAD_COMPLETE"
    LOAD_FAIL = "TRITONREPOAGENT_ACTION_LOAD_FAIL"
    UNLOAD = "TRITONREPOAGENT_ACTION_UNLOAD"
    UNLOAD_COMPLETE = "TRITONREPOAGENT_ACTION_UNLOAD_COMPLETE"


class AgentError(Exception):
    """An agent refused the model (the message is the agent's; the load fails with it)."""


@dataclass(frozen=True)
class AgentModel:
    """What an agent is given about the model: its folder (opened beneath the repository), config, parameters."""

    folder: ModelFolder
    config: pb.ModelConfig
    parameters: Mapping[str, str]

    @property
    def location(self) -> Path:
        return self.folder.path


class RepositoryAgent(Protocol):
    def model_action(self, action: AgentAction, model: AgentModel) -> None:
        """Act on ``model`` for ``action``; raise AgentError to fail a LOAD (other actions only log it)."""
        ...


class ChecksumAgent:
    """Triton's checksum agent: on LOAD, every ``<ALGORITHM>:<file>`` parameter's file must have that digest."""

    def model_action(self, action: AgentAction, model: AgentModel) -> None:
        if action is not AgentAction.LOAD:
            return
        for key, expected in model.parameters.items():
            algorithm, sep, relative = key.partition(":")
            if not sep:
                raise AgentError(f"failed to parse key: {key}")
            if algorithm.lower() != "md5":
                raise AgentError(f"Unsupported checksum algorithm: {algorithm}")
            got = _md5_of(model.folder, relative)
            if got != expected:
                raise AgentError(f"Mismatched MD5 hash for file {relative}, expect: {expected}, got: {got}")


def _md5_of(folder: ModelFolder, relative: str) -> str:
    """The file's MD5 hex digest, read through the model folder's descriptor (never outside the folder)."""
    try:
        path = folder.pin(relative, "checksum agent file")
        digest = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as file:
            while block := file.read(_READ_BLOCK):
                digest.update(block)
        return digest.hexdigest()
    except PathEscape as exc:
        raise AgentError(f"failed to open text file for read {relative}: {exc}") from None
    except OSError as exc:
        raise AgentError(f"failed to open text file for read {relative}: {os.strerror(exc.errno or 0)}") from None


BUILT_IN: dict[str, Callable[[], RepositoryAgent]] = {"checksum": ChecksumAgent}


def find_agent(name: str, directory: str = DEFAULT_DIRECTORY) -> RepositoryAgent:
    """The agent called ``name``: built in, else from the entry-point group; AgentError in Triton's words."""
    if name in BUILT_IN:
        return BUILT_IN[name]()
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        found = entry.load()
        return found() if isinstance(found, type) else found  # type: ignore[no-any-return]
    raise AgentError(f"unable to find 'libtritonrepoagent_{name}.so' for repo agent '{name}', searched: {directory}")


@dataclass
class AgentSession:
    """The agents of one load of one model, in the config's order, and the last action they were told."""

    model: str
    folder: ModelFolder
    agents: Sequence[tuple[str, RepositoryAgent, AgentModel]] = field(default_factory=list)
    state: AgentAction | None = None

    def load(self) -> None:
        """LOAD, in order: the first refusal fails the load (the agents told so far get LOAD_FAIL)."""
        for index, (_, agent, model) in enumerate(self.agents):
            try:
                agent.model_action(AgentAction.LOAD, model)
            except AgentError:
                self.state = AgentAction.LOAD
                self._tell(AgentAction.LOAD_FAIL, self.agents[: index + 1])
                raise
        self.state = AgentAction.LOAD

    def loaded(self, ok: bool) -> None:
        """LOAD_COMPLETE (the model serves) or LOAD_FAIL, in reverse order."""
        if self.state is AgentAction.LOAD:
            self.state = AgentAction.LOAD_COMPLETE if ok else AgentAction.LOAD_FAIL
            self._tell(self.state, self.agents)
            if not ok:
                self.close()

    def unload(self) -> None:
        """UNLOAD then UNLOAD_COMPLETE (what this session loaded is gone), then release the folders."""
        if self.state is AgentAction.LOAD_COMPLETE:
            self.state = AgentAction.UNLOAD
            for _, agent, model in self.agents:
                self._one(agent, model, AgentAction.UNLOAD)
            self.state = AgentAction.UNLOAD_COMPLETE
            self._tell(AgentAction.UNLOAD_COMPLETE, self.agents)
        self.close()

    def close(self) -> None:
        self.folder.close()

    def _tell(self, action: AgentAction, agents: Sequence[tuple[str, RepositoryAgent, AgentModel]]) -> None:
        for _, agent, model in reversed(agents):
            self._one(agent, model, action)

    def _one(self, agent: RepositoryAgent, model: AgentModel, action: AgentAction) -> None:
        try:
            agent.model_action(action, model)
        except Exception as exc:  # only a LOAD can fail the model; Triton logs the others
            log.error("repository agent of model '%s' failed on %s: %s", self.model, action.value, exc)


def open_session(repository: Path, config: pb.ModelConfig, directory: str = DEFAULT_DIRECTORY) -> AgentSession | None:
    """The agents ``config`` names (None when it names none); AgentError when one is not found."""
    entries = list(config.model_repository_agents.agents)
    if not entries:
        return None
    found = [(entry.name, find_agent(entry.name, directory), dict(entry.parameters)) for entry in entries]
    folder = ModelFolder(repository, config.name)
    copy = pb.ModelConfig()
    copy.CopyFrom(config)
    agents = [(name, agent, AgentModel(folder, copy, parameters)) for name, agent, parameters in found]
    return AgentSession(config.name, folder, agents)
