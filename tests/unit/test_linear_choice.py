"""Choosing the linear kernel shape by shape (tessera.linear_choice): the decision rule
on given timings, and that what `auto` reports is what it packed."""

from __future__ import annotations

import pytest
import torch

from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.linear_choice import (
    MAX_QUIET_WAIT_SECONDS,
    ShapeTiming,
    apply_linear_kernel,
    time_kernels,
    time_shapes,
    time_shapes_on_a_quiet_host,
)
from tessera.onednn_linear import OneDnnLinear, packable_linears
from tessera.thread_governor import CpuSample

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch is built without oneDNN"
)

ROWS = (1, 4, 16, 64)


def _timing(ratios: tuple[float, ...]) -> ShapeTiming:
    torch_seconds = (1e-5, 2e-5, 4e-5, 8e-5)
    onednn = tuple(t * r for t, r in zip(torch_seconds, ratios, strict=True))
    return ShapeTiming((512, 512), 8, ROWS, torch_seconds, onednn)


def test_the_geometric_mean_of_the_ratios_decides():
    # The module docstring's examples: each row count weighs the same.
    assert _timing((1.62, 1.81, 0.94, 0.98)).onednn_ratio == pytest.approx(1.29, abs=0.01)
    assert _timing((1.62, 1.81, 0.94, 0.98)).kernel == "torch"
    assert _timing((1.17, 0.91, 0.72, 0.81)).onednn_ratio == pytest.approx(0.89, abs=0.01)
    assert _timing((1.17, 0.91, 0.72, 0.81)).kernel == "onednn"
    # Within 5%: torch's path stays (no private op for a tie).
    assert _timing((0.97, 0.97, 0.97, 0.97)).kernel == "torch"
    assert "512x512 (x8): onednn, oneDNN/torch 0.50" in _timing((0.5,) * 4).describe()


class _Model(torch.nn.Module):
    """Two shapes, one linear held twice, and a head tied to the embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(12, 16)
        shared = torch.nn.Linear(16, 16)
        self.body = torch.nn.Sequential(shared, torch.nn.Linear(16, 32), torch.nn.SiLU())
        self.tail = torch.nn.Sequential(torch.nn.Linear(32, 16), shared)
        self.head = torch.nn.Linear(16, 12, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.tail(self.body(self.embed(token_ids))))


def test_each_shape_is_timed_once_over_its_own_linears():
    model = _Model().eval()
    timings = {t.shape: t for t in time_shapes(model, [model])}
    # The tied head is never packed, so never timed; the shared linear counts once.
    assert {shape: t.num_linears for shape, t in timings.items()} == {
        (16, 16): 1,
        (32, 16): 1,
        (16, 32): 1,
    }
    for timing in timings.values():
        assert timing.row_counts == ROWS
        assert all(s > 0 for s in (*timing.torch_seconds, *timing.onednn_seconds))


def test_timing_leaves_the_model_as_it_was():
    linear = torch.nn.Linear(16, 8).eval()
    weight = linear.weight.detach().clone()
    time_kernels([linear], row_counts=(1, 2), num_rounds=1)
    assert torch.equal(linear.weight, weight) and type(linear) is torch.nn.Linear


def test_auto_reports_what_it_packed_and_computes_what_torch_does():
    model = _Model().eval()
    token_ids = torch.tensor([1, 2, 3, 4, 5])
    with torch.inference_mode():
        expected = model(token_ids)
    packable = {id(linear) for _, _, linear in packable_linears(model, [model])}
    chosen = apply_linear_kernel(model, [model], "auto")
    packed = [m for m in model.modules() if isinstance(m, OneDnnLinear)]
    dense = [m for m in model.modules() if type(m) is torch.nn.Linear and m is not model.head]
    assert chosen.startswith("auto:")
    kernels = set(chosen.removeprefix("auto:").split("+"))
    assert ("onednn" in kernels) == bool(packed) and ("torch" in kernels) == bool(dense)
    assert len(packed) + len(dense) == len(packable)
    with torch.inference_mode():
        torch.testing.assert_close(model(token_ids), expected, rtol=1e-4, atol=1e-5)


def test_forced_kernels_and_an_unknown_one():
    model = _Model().eval()
    assert apply_linear_kernel(model, [model], "torch") == "torch"
    assert not [m for m in model.modules() if isinstance(m, OneDnnLinear)]
    assert apply_linear_kernel(model, [model], "onednn") == "onednn"
    assert [m for m in model.modules() if type(m) is torch.nn.Linear] == [model.head]
    with pytest.raises(ValueError, match="expected one of auto, onednn, torch"):
        apply_linear_kernel(_Model().eval(), [model], "mkl")


def test_a_family_loaded_with_auto_keeps_its_argmax(demo_model_dir):
    parts = ModelPart.PROCESSOR | ModelPart.LANGUAGE_MODEL
    chosen = load_family(str(demo_model_dir), LoadOptions(parts, linear_kernel="auto"))
    dense = load_family(str(demo_model_dir), LoadOptions(parts))
    assert chosen.linear_kernel.startswith("auto:") and dense.linear_kernel == "torch"
    prompt = torch.tensor(chosen.tokenize("a short prompt for the tiny model"))
    logits = []
    for family in (chosen, dense):
        hidden = family.forward(family.embed_tokens(prompt), torch.arange(len(prompt))[None])
        logits.append(family.compute_logits(hidden[-1:])[0])
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert int(logits[0].argmax()) == int(logits[1].argmax())


class _Host:
    """The host's CPU counters as `sample_cpus` reads them, scripted: over each pair of
    samples (a quiet check, or one timing) the rest of the host keeps `others[i]` CPUs
    busy (the last value from then on). Its clock moves with the pauses."""

    def __init__(self, others: list[float]):
        self.others = others
        self.samples = 0
        self.wall = self.busy = 0.0
        self.pauses: list[float] = []

    def sample(self) -> CpuSample:
        if self.samples % 2:  # the end of a window
            self.wall += 1.0
            self.busy += self.others[min(self.samples // 2, len(self.others) - 1)]
        self.samples += 1
        return CpuSample(self.wall, self.busy, 0.0)

    def clock(self) -> float:
        return sum(self.pauses)

    def time_shapes(self, model: torch.nn.Module):
        return time_shapes_on_a_quiet_host(
            model, [model], self.sample, self.pauses.append, self.clock
        )


def test_a_quiet_host_is_timed_at_once():
    host = _Host([0.1, 0.05])
    timings, others = host.time_shapes(_Model().eval())
    assert len(timings) == 3 and others == pytest.approx(0.05)
    assert host.pauses == [0.25] and host.samples == 4  # one check, one timing


def test_timing_waits_for_the_host_to_be_quiet_and_for_a_quiet_timing():
    # Busy when checked; then quiet when checked but busy while timed; then quiet.
    host = _Host([1.5, 0.1, 1.2, 0.1, 0.1])
    timings, others = host.time_shapes(_Model().eval())
    assert timings is not None and others == pytest.approx(0.1)
    assert host.samples == 10
    checks, retries = host.pauses[0::2], host.pauses[1::2]
    assert checks == [0.25, 0.25, 0.25] and all(0.5 <= p <= 1.0 for p in retries)


def test_a_host_that_stays_busy_gets_no_timings():
    host = _Host([1.5])
    timings, others = host.time_shapes(_Model().eval())
    assert timings is None and others == pytest.approx(1.5)
    # Waited its time, then gave up.
    assert MAX_QUIET_WAIT_SECONDS <= host.clock() < MAX_QUIET_WAIT_SECONDS + 2.0
