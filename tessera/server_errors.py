"""Start-up errors a service reports in one line (the CLI imports this without grpc)."""

from __future__ import annotations


class PortTakenError(OSError):
    """The service's port is already bound by another process."""


class StartupError(RuntimeError):
    """A service could not load what it serves (its model, most often); the message says
    what, in one line. The cause is chained, for --log-level debug."""


def one_line(error: BaseException) -> str:
    """`error`'s message on one line (library messages often span several)."""
    text = " ".join(str(error).split())
    return text or type(error).__name__
