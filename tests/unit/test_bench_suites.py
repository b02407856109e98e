"""`make bench` keeps every suite's tables when one suite fails, and still fails."""

from __future__ import annotations

from benchmarks.options import run_suites
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
