"""The local cluster's child processes (etcd, kube-apiservers, kube-controller-manager).

A :class:`Process` is one child and the log file it writes: each start appends a line
naming the time and the command, then the child's output, so the log keeps every run of
an apiserver that is restarted (into another release, say). A child that exits when it
should run raises :class:`ProcessError` with the end of its log.

A killed test run leaves no servers behind: each child asks Linux, between fork and
exec, for SIGTERM when its parent dies (the parent-death signal). Linux sends that signal
when the *thread* that forked the child ends, not the process, so every child is forked
from one thread that lives as long as the Python process: a child started from a
short-lived thread (a worker of ``asyncio.to_thread``, say) would otherwise be killed as
soon as that worker is retired.

Stdlib only, loaded by path beside ``cluster.py`` (which runs as a script).
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_LOG_TAIL_LINES = 40


class ProcessError(RuntimeError):
    """A child process is not running, or exited when it should run."""


@dataclass
class Process:
    """One child process and the log file it writes."""

    name: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        with self.log_path.open("ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} {' '.join(command)}\n".encode())
            log.flush()
            self.popen = _SPAWNER.submit(
                subprocess.Popen,
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=None if env is None else dict(env),
                preexec_fn=_die_with_parent,
            ).result()

    def check_alive(self) -> None:
        if self.popen is None:
            raise ProcessError(f"{self.name} is not running")
        code = self.popen.poll()
        if code is not None:
            raise ProcessError(f"{self.name} exited with code {code}.\n{self.log_tail()}")

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``stop()`` waits)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()

    def stop(self, timeout: float) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; safe to repeat."""
        popen, self.popen = self.popen, None
        if popen is None or popen.poll() is not None:
            return
        popen.terminate()
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the running process (e.g. SIGSTOP, SIGCONT)."""
        self.check_alive()
        assert self.popen is not None
        self.popen.send_signal(signum)

    def kill(self) -> None:
        popen, self.popen = self.popen, None
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait()

    def log_tail(self) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return f"(no log at {self.log_path})"
        lines = text.splitlines()[-_LOG_TAIL_LINES:]
        return f"Last lines of {self.log_path}:\n" + "\n".join(lines)


# The one thread every child is forked from (see the module's docstring).
_SPAWNER = concurrent.futures.ThreadPoolExecutor(
    max_workers=1, thread_name_prefix="svledger-spawner"
)


def _die_with_parent() -> None:
    # Runs in the forked child before exec: ask Linux to SIGTERM the process when the
    # thread that started it ends (the spawner's lives as long as its process).
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
