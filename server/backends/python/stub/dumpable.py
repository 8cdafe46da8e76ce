"""Keeping processes of the same user out of this process's descriptors and memory (Linux).

A Python model's stub runs its code as the server's user. A process of the same user may, by default,
open ``/proc/<pid>/fd/<n>`` of another (the shared-memory segments holding other models' tensors, any
file the server has open), read its ``/proc/<pid>/mem``, ``environ`` and ``maps``, ptrace it, or take
its descriptors with ``pidfd_getfd``. The kernel allows all of that only while the target is
*dumpable*: ``prctl(PR_SET_DUMPABLE, 0)`` makes those ``/proc`` files root's and refuses the ptrace
access checks to anyone without ``CAP_SYS_PTRACE``. The process itself keeps its own
``/proc/self`` (the kernel lets a process see its own files whatever the flag). ``/proc/<pid>/status``,
``stat``, ``statm`` and ``cmdline`` stay readable by everyone, as always, and signals are not affected
(a process of the same user can still kill this one: SECURITY.md says so).

The flag is reset by ``execve``, so it is set by the server at start and by each stub before it runs any
model code. Side effect: no core dumps of these processes, and a debugger (py-spy, gdb) needs
``CAP_SYS_PTRACE``.

Stub-safe (standard library only): see ``context``.
"""

from __future__ import annotations

import ctypes
import sys

#: <linux/prctl.h>
PR_SET_DUMPABLE = 4


def make_non_dumpable() -> bool:
    """Refuse other processes of this user this process's ``/proc`` descriptors and memory; False where
    there is no such setting (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's prctl (glibc and musl)
    zero = ctypes.c_ulong(0)
    if libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), zero, zero, zero, zero) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    return True
