"""Each overlay (and each component composition) is rendered once per session."""

from __future__ import annotations

import pytest

from tests.deploy.k8s import OVERLAYS, VARIANTS, Rendered, kustomize, variant_dir

TARGETS = [*OVERLAYS, *VARIANTS]


@pytest.fixture(scope="session")
def renders(tmp_path_factory) -> dict[str, Rendered]:
    variants = tmp_path_factory.mktemp("kustomize")
    out = {name: Rendered(name, kustomize(path)) for name, path in OVERLAYS.items()}
    for name in VARIANTS:
        out[name] = Rendered(name, kustomize(variant_dir(name, variants)))
    return out


@pytest.fixture(params=TARGETS)
def rendered(request, renders) -> Rendered:
    """One rendered overlay or composition; tests using it run for each."""
    return renders[request.param]
