"""What every process the `serve --workers N` supervisor spawns does first (workers.py)."""

from __future__ import annotations

import os
import signal

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID`: every thread's Python stack on stderr, the process carries on."""
    import faulthandler
    import sys
    if sys.stderr is not None:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def become_child(name: str) -> None:
    """Own process group (a Ctrl-C at a terminal reaches only the supervisor, which forwards
    one SIGTERM), `name` in ps/top (/proc/PID/comm, at most 15 bytes), and SIGTERM when the
    supervisor dies, even by SIGKILL: no orphans serving. SIGUSR1 writes every thread's stack
    to stderr (a member that does not stop or answer says where it waits)."""
    os.setpgid(0, 0)
    dump_stacks_on_sigusr1()
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, name.encode()[:15])
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)   # Linux
    except (OSError, AttributeError):
        pass
