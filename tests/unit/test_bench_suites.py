"""`make bench` keeps every suite's tables when one suite fails, and still fails."""

from __future__ import annotations

import pytest

from benchmarks.options import run_bench, run_suites
from benchmarks.report import failed_suites_section


class _Bench:
    """Suites that record that they ran; `wire` fails as a refused request would."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def arms_suite(self) -> None:
        self.ran.append("arms")

    def wire_suite(self) -> None:
        raise RuntimeError("INVALID_ARGUMENT: the video took over 30 s")

    def step_suite(self) -> None:
        self.ran.append("step")

    def video_suite(self) -> None:
        self.ran.append("video")

    def start(self) -> None:
        self.ran.append("start")

    def stop(self) -> None:
        self.ran.append("stop")


def test_a_failing_suite_is_reported_and_the_suites_after_it_still_run(capsys):
    bench = _Bench()
    failed = run_suites(bench, ["step", "wire", "arms"])
    assert bench.ran == ["arms", "step"]  # SUITES order, not the order asked
    assert failed == {"wire": "RuntimeError: INVALID_ARGUMENT: the video took over 30 s"}
    assert "the video took over 30 s" in capsys.readouterr().err  # the traceback


def test_no_failure_no_section_and_a_failure_is_named_in_the_report():
    assert run_suites(_Bench(), ["arms", "step"]) == {}
    text = "\n".join(failed_suites_section({"video": "RuntimeError: boom"}))
    assert "Suites that failed" in text and "| video | RuntimeError: boom |" in text


def test_suites_that_start_their_own_processes_run_once_the_deployments_are_stopped():
    bench = _Bench()
    failed = run_bench(bench, ["video", "wire", "step", "arms"])
    assert bench.ran == ["start", "arms", "stop", "step", "video"]
    assert list(failed) == ["wire"]


class _BenchThatCannotStart(_Bench):
    def start(self) -> None:
        raise RuntimeError("a decoder did not start")


def test_deployments_that_fail_to_start_are_stopped_and_nothing_else_runs():
    bench = _BenchThatCannotStart()
    with pytest.raises(RuntimeError, match="did not start"):
        run_bench(bench, ["arms", "video"])
    assert bench.ran == ["stop"]
