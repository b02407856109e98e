"""The zygote the suite forks its services from (tessera.testbed.zygote): a forked command
gets the caller's arguments, environment, directory and log file, its exit code or signal
comes back as `subprocess` reports it, and ending the zygote ends its children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tessera.children import Child, wait_healthy
from tessera.launcher import free_port
from tessera.testbed.zygote import ForkedProcess, Zygote, ZygoteGoneError


@pytest.fixture(scope="module")
def forks() -> Iterator[Zygote]:
    """A zygote of its own, so that closing it ends no other test's services (closed
    again at the end: closing twice is harmless)."""
    own = Zygote()
    try:
        yield own
    finally:
        own.close()


def spawn(forks: Zygote, tmp_path, *args: str, **env: str) -> tuple[ForkedProcess, object]:
    log = tmp_path / "log.txt"
    return forks.spawn(list(args), log, {**os.environ, **env}, argv0="tessera"), log


def test_a_refused_environment_reads_as_in_a_cold_process(forks, tmp_path, demo_model_dir):
    """The environment is the caller's (the decoder's parser reads this default when it
    is built), and the exit code and output are a cold process's."""
    args = ["decoder", "--model", str(demo_model_dir), "--port", "0"]
    process, log = spawn(forks, tmp_path, *args, TESSERA_LINEAR_KERNEL="bogus")
    cold = subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TESSERA_LINEAR_KERNEL": "bogus"},
    )
    assert "TESSERA_LINEAR_KERNEL='bogus'" in cold.stderr
    assert process.wait(120) == cold.returncode == 1
    assert process.poll() == 1 and process.returncode == 1
    assert log.read_text() == cold.stdout + cold.stderr


def test_a_relative_path_is_the_callers_directory(forks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    process, log = spawn(forks, tmp_path, "make-demo-model", "made", "--seed", "3")
    assert process.wait(120) == 0, log.read_text()
    assert (tmp_path / "made" / "config.json").exists()


def test_what_an_import_prints_never_reaches_the_reports(tmp_path, capfd):
    """`this` prints the Zen of Python on import: to the zygote's stderr, and its reports
    still arrive (before, stdout carried both and the first report could not be read)."""
    own = Zygote(preload=("this",))
    try:
        process, log = spawn(own, tmp_path, "make-demo-model", "x", "--family", "nope")
        assert process.wait(120) == 2
    finally:
        own.close()
    assert "invalid choice: 'nope'" in log.read_text()
    assert "Beautiful is better than ugly" in capfd.readouterr().err
    assert "Beautiful" not in log.read_text()  # nor left in a buffer the child flushes


def serving_encoder(forks: Zygote, tmp_path, model_dir) -> tuple[ForkedProcess, object]:
    address = f"127.0.0.1:{free_port()}"
    args = ["encoder", "--model", str(model_dir), "--port", address.rsplit(":", 1)[1]]
    process, log = spawn(forks, tmp_path, *args)
    wait_healthy([Child("encoder", address, process)], 180)
    return process, log


def test_a_service_stops_on_sigterm_and_a_kill_reads_as_the_signal(forks, tmp_path, demo_model_dir):
    process, log = serving_encoder(forks, tmp_path, demo_model_dir)
    assert " ready: " in log.read_text()
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.1)
    process.terminate()
    assert process.wait(60) == 0
    killed, _ = serving_encoder(forks, tmp_path, demo_model_dir)
    killed.kill()
    assert killed.wait(60) == -signal.SIGKILL


def test_closing_the_zygote_ends_its_children(forks, tmp_path, demo_model_dir):
    """Runs last in this module: it closes the module's zygote."""
    process, _ = serving_encoder(forks, tmp_path, demo_model_dir)
    forks.close()
    assert process.wait(0) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(process.pid, 0)
    with pytest.raises(ZygoteGoneError):
        forks.spawn(["encoder"], tmp_path / "late.txt", dict(os.environ), argv0="tessera")
