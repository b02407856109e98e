"""Test services forked from one process that imported their heavy modules once.

A cold `python -m tessera.cli decoder` spends most of its start importing torch,
torchvision (whose ops import `torch._dynamo`), transformers and grpc: ~6 s of CPU on a
2-core test host, against well under a second to load a tiny checkpoint and serve. The
test suite starts dozens of stacks. The zygote pays those imports once per test session
and forks every service from there, as multiprocessing's forkserver does: a stack is
ready in a few seconds instead of ~20.

What a forked service runs is `tessera.cli.main(args)`, the entry a cold process runs,
after the same imports, with the caller's environment, working directory and log file;
only the interpreter start and the imports are shared. The zygote imports and nothing
more: no model, no event loop, no thread but the idle OpenBLAS pool numpy starts at
import (which OpenBLAS itself prepares for a fork). What forks share that cold
processes would not: the seed of `hash()` for str and bytes (nothing in Tessera compares
`hash()` across processes: routing and content hashes are hashlib's) and what the
imports read from the environment (the zygote's is the suite's own). `tessera serve`,
the fleets on test hosts and the benchmarks start services cold, and tests/integration
and tests/deploy/test_serve_fleet.py run that path.

The zygote speaks JSON lines (nothing is unpickled). Asked on its stdin
`{"args": [...], "env": {...}, "cwd": "...", "log": "..."}`, it forks and answers
`{"spawned": pid}`; when a child ends it says `{"exited": pid, "returncode": rc}` (rc as
`subprocess` gives it: negative for a signal). At the end of its stdin it kills the
children still running and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Queue

from tessera.architectures import FAMILY_CLASSES

# What every service imports before it loads a checkpoint: the services' modules, each
# family's adapter (which import torch, torchvision, transformers and grpc) and model
# classes (which transformers loads lazily), as "module" or "module:attribute".
PRELOAD = (
    "tessera.cli",
    "encoder_service.main",
    "decoder_service.main",
    "gateway.main",
    *sorted({name.split(":")[0] for name in FAMILY_CLASSES.values()}),
    *(f"transformers:{architecture}" for architecture in FAMILY_CLASSES),
)


class ZygoteGoneError(RuntimeError):
    """The zygote exited: no child can be started, and exits are no longer reported."""


@dataclass(eq=False)
class ForkedProcess:
    """A service the zygote forked: the part of `subprocess.Popen` the testbed uses."""

    args: list[str]
    pid: int
    zygote: Zygote
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.zygote.wait_exit(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended before the zygote said so
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass(eq=False)
class Zygote:
    """The test process's side: starts the zygote on the first `spawn` and keeps its
    reports. Thread-safe. `preload`: what the zygote imports (PRELOAD's form)."""

    preload: tuple[str, ...] = PRELOAD
    _process: subprocess.Popen | None = None
    _spawned: Queue = field(default_factory=Queue)
    _exits: dict[int, int] = field(default_factory=dict)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _spawn_lock: threading.Lock = field(default_factory=threading.Lock)
    _reports: threading.Thread | None = None
    _gone: bool = False

    def spawn(
        self, args: list[str], log_path: Path, env: Mapping[str, str], argv0: str
    ) -> ForkedProcess:
        """Forks `tessera <args>` with `env`, this process's working directory, stdout and
        stderr appended to `log_path`. `argv0`: the command line `subprocess` would show."""
        request = {"args": args, "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
        with self._spawn_lock:
            if self._gone:
                raise ZygoteGoneError("the zygote was closed")
            process = self._started()
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            pid = self._spawned.get()
        if pid is None:
            raise ZygoteGoneError(f"the zygote exited (code {process.poll()})")
        return ForkedProcess([argv0, *args], pid, self)

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            self._check_alive(pid)
            return self._exits.get(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self._gone, timeout)
            self._check_alive(pid)
            return self._exits.get(pid)

    def close(self) -> None:
        """Ends the zygote; it kills any child still running."""
        with self._spawn_lock:
            if self._process is None:
                self._gone = True
                return
            self._process.stdin.close()
            self._process.wait(60)
            self._reports.join(60)  # the last exits read, then `_gone`

    def _check_alive(self, pid: int) -> None:
        if self._gone and pid not in self._exits:
            raise ZygoteGoneError(f"the zygote exited; pid {pid} is no longer followed")

    def _started(self) -> subprocess.Popen:
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tessera.testbed.zygote", *self.preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self._reports = threading.Thread(
                target=self._read_reports, name="zygote-reports", daemon=True
            )
            self._reports.start()
        return self._process

    def _read_reports(self) -> None:
        for line in self._process.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                sys.stderr.write(f"the zygote wrote what is no report, {line!r}; stopping\n")
                self._process.kill()
                break
            if "spawned" in report:
                self._spawned.put(report["spawned"])
            else:
                with self._changed:
                    self._exits[report["exited"]] = report["returncode"]
                    self._changed.notify_all()
        with self._changed:
            self._gone = True
            self._changed.notify_all()
        self._spawned.put(None)


# -- the zygote process ------------------------------------------------------------------


def _report(reports: int, message: dict) -> None:
    os.write(reports, (json.dumps(message) + "\n").encode())


def _reap(children: set[int], reports: int) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        _report(reports, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _kill_all(children: set[int], reports: int) -> None:
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    for pid in children:
        _, status = os.waitpid(pid, 0)
        _report(reports, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _preload(names: Sequence[str]) -> None:
    import importlib

    for name in names:
        module_name, _, attribute = name.partition(":")
        module = importlib.import_module(module_name)
        if attribute:
            getattr(module, attribute)


def serve_forks(preload: Sequence[str]) -> dict:
    """The zygote's loop: a fork per request. Returns only in a forked child, with the
    request it is to run."""
    # Reports go out on the stdout the zygote was given; whatever an import prints goes
    # to stderr, never into them.
    reports = os.dup(1)
    os.dup2(2, 1)
    _preload(preload)
    sys.stdout.flush()  # what the imports printed, not into a child's log at its exit
    sys.stderr.flush()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # only to wake select()
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake_read], [], [])
        if wake_read in readable:
            os.read(wake_read, 4096)
            _reap(children, reports)
        if 0 not in readable:
            continue
        data = os.read(0, 65536)
        if not data:
            _kill_all(children, reports)
            raise SystemExit(0)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _become_child(request, (wake_read, wake_write, reports))
                return request
            children.add(pid)
            _report(reports, {"spawned": pid})


def _become_child(request: dict, zygote_fds: tuple[int, ...]) -> None:
    """What a fresh `python -m tessera.cli` would have: default signal handling, its own
    log file on stdout and stderr, no stdin, the caller's environment and directory, none
    of the zygote's pipes."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in zygote_fds:
        os.close(fd)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for target, source in ((0, null), (1, log), (2, log)):
        os.dup2(source, target)
    os.close(log)
    os.close(null)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's own streams)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    import tessera.cli

    sys.argv = [tessera.cli.__file__, *request["args"]]
    if "numpy" in sys.modules:  # `random` reseeds itself after a fork; numpy does not
        sys.modules["numpy"].random.seed()


if __name__ == "__main__":
    child_request = serve_forks(sys.argv[1:])
    from tessera.cli import main

    sys.exit(main(child_request["args"]))
