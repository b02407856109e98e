"""The language model's linear layers on oneDNN, with each weight packed once at load.

A decode step multiplies every weight by one row per running request. On the AMD EPYC
host of docs/benchmarks.md torch's default CPU matmul (MKL's sgemm) re-laid the weight
out in every call, which dominated the step. oneDNN, given the weight reordered into its
own layout once, does the few-row product at about the speed the weight streams from
memory: there, steps of 1 / 4 / 16 requests 5.5 / 7.7 / 16.3 ms against 7.7 / 10.1 /
17.7 ms on the bench checkpoint, a prefill chunk ~10% faster too. vLLM's CPU backend
packs its linear weights with oneDNN the same way. On an Intel Xeon host MKL did most of
those few-row products faster still, so which shapes are packed is measured on the host
at load (tessera.linear_choice).

The packed weight replaces the dense one (no second copy), except where the weight is
shared with a module left alone (an lm_head tied to the input embeddings keeps torch's
path rather than hold the vocabulary twice). Outputs differ from torch's in the last
bits (another order of summation), as a batch of 4 already differs from a batch of 1:
greedy tokens may differ from `generate()`'s only at near-ties (docs/design.md).

Only on a CPU in float32, where that rule is tested.
"""

from __future__ import annotations

from collections.abc import Collection

import torch


class OneDnnLinear(torch.nn.Module):
    """`torch.nn.Linear`'s forward over a weight (and bias) packed for oneDNN."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        bias = None if linear.bias is None else linear.bias.detach()
        # Not in the state dict: the checkpoint's dense tensors stay the saved form.
        self.register_buffer("packed_weight", linear.weight.detach().to_mkldnn(), persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        # Dense rows in and out, in one call: converting them to oneDNN's tensors and back
        # around `mkldnn_linear` cost more than the product itself at a decode step's rows.
        return torch.ops.mkldnn._linear_pointwise(
            rows, self.packed_weight, self.bias, "none", [], ""
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN"


def onednn_applies(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `pack_linears` packs anything for a model on `device` in `dtype`."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


Shape = tuple[int, int]  # (out_features, in_features)


def linear_shape(linear: torch.nn.Linear) -> Shape:
    """The key `pack_linears(shapes=...)` selects by, and `tessera.linear_choice` times by."""
    return (linear.out_features, linear.in_features)


def pack_linears(
    model: torch.nn.Module,
    roots: list[torch.nn.Module],
    shapes: Collection[Shape] | None = None,
) -> int:
    """Replaces the linears of `packable_linears(model, roots)` by `OneDnnLinear`s (only
    those whose `linear_shape` is in `shapes`, when given) and returns how
    many it replaced.

    Call on a model already on its device, in eval mode: a packed weight cannot move.
    """
    packed: dict[int, OneDnnLinear] = {}  # one packed copy of a linear held twice
    for parent, name, linear in packable_linears(model, roots):
        if shapes is not None and linear_shape(linear) not in shapes:
            continue
        if id(linear) not in packed:
            packed[id(linear)] = OneDnnLinear(linear)
        setattr(parent, name, packed[id(linear)])
    return len(packed)


def packable_linears(
    model: torch.nn.Module, roots: list[torch.nn.Module]
) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, attribute name, linear) of every `torch.nn.Linear` in `roots` (modules of
    `model`), but for a linear whose weight another module of `model` also holds (tied
    embeddings); a linear held by two parents is listed for each."""
    chosen = _linears(roots)
    held_elsewhere = {
        parameter.data_ptr()
        for module in model.modules()
        if id(module) not in chosen
        for parameter in module.parameters(recurse=False)
    }
    return [
        (parent, name, linear)
        for parent, name, linear in _linear_slots(model, chosen)
        if linear.weight.data_ptr() not in held_elsewhere
    ]


def _linears(roots: list[torch.nn.Module]) -> set[int]:
    """ids of the plain linears in `roots` (a subclass may change the forward: left out)."""
    return {
        id(module) for root in roots for module in root.modules() if type(module) is torch.nn.Linear
    }


def _linear_slots(model: torch.nn.Module, chosen: set[int]):
    """(parent, attribute name, linear) of each chosen linear, listed before any change."""
    return [
        (parent, name, child)
        for parent in model.modules()
        # _modules, not named_children(): that lists a module held twice only once.
        for name, child in parent._modules.items()
        if id(child) in chosen
    ]
