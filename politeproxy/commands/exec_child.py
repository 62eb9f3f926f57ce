"""One child process whose exit status and signals pass through `politeproxy exec` (both its halves).

The signals are blocked and taken with sigtimedwait, which says who sent each one: a signal the terminal
sent (Ctrl-C: ``si_code`` SI_KERNEL) went to the whole foreground process group, the command included,
so it is not sent again; one sent to this process alone (``kill``, a supervisor's SIGTERM) is passed on.
The child starts with the signals unblocked, before any thread of this process exists.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence

FORWARDED = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
)  # fmt: skip
SI_KERNEL = 0x80  # <asm-generic/siginfo.h>: sent by the kernel, the terminal's Ctrl-C and Ctrl-\ among them
POLL = 0.25  # seconds between looks at the child when no signal comes (SIGCHLD usually wakes it first)


def _unblock() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def spawn(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Block the passed-on signals in this process and start ``argv`` with them unblocked.

    Call before starting any thread: the mask is inherited by threads started later, and the child's
    unblocking runs between fork and exec."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
    try:
        return subprocess.Popen(list(argv), env=dict(env) if env is not None else None, preexec_fn=_unblock)
    except BaseException:
        _unblock()
        raise


def wait_forwarding(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc``, passing on each signal sent to this process alone; its returncode (negative: the
    signal that ended it)."""
    wanted = {*FORWARDED, signal.SIGCHLD}
    while True:
        rc = proc.poll()
        if rc is not None:
            return rc
        info = signal.sigtimedwait(wanted, POLL)
        if info is None or info.si_signo == signal.SIGCHLD or info.si_code == SI_KERNEL:
            continue
        try:
            proc.send_signal(info.si_signo)
        except ProcessLookupError:  # it ended meanwhile: poll() says how
            pass


def exit_like(returncode: int) -> int:
    """Leave as the child did: killed by the same signal (the shell sees WIFSIGNALED), or its exit code."""
    if returncode >= 0:
        return returncode
    sig = -returncode
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        os.kill(os.getpid(), sig)
    try:
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    return 128 + sig  # a signal whose default is not to end the process (SIGCHLD, SIGWINCH, ...)
