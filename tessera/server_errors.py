"""Start-up errors a service reports in one line (the CLI imports this without grpc)."""

from __future__ import annotations


class PortTakenError(OSError):
    """The service's port is already bound by another process."""
