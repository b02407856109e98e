"""The language model's linears on oneDNN (tessera.onednn_linear): what is packed, what
is left alone, and that the outputs stay torch's up to the last bits."""

from __future__ import annotations

import pytest
import torch

from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.onednn_linear import OneDnnLinear, onednn_applies, pack_linears

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch is built without oneDNN"
)


class _Scaled(torch.nn.Linear):
    """A linear subclass with its own forward: packing it would drop the scaling."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(rows)


class _Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.nn.Embedding(11, 8)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8, bias=False)
        )
        self.scaled = _Scaled(8, 8)
        self.head = torch.nn.Linear(8, 11, bias=False)
        self.head.weight = self.embed.weight  # tied, as many checkpoints tie lm_head
        for parameter in self.parameters():
            parameter.data.normal_(0, 0.5, generator=generator)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.scaled(self.body(self.embed(token_ids))))


def test_plain_linears_are_packed_in_place_and_compute_what_torch_does():
    model = _Toy().eval()
    token_ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    with torch.inference_mode():
        expected = model(token_ids)
    assert pack_linears(model, [model.body, model.scaled, model.head]) == 2
    assert [type(m) for m in model.body] == [OneDnnLinear, torch.nn.SiLU, OneDnnLinear]
    # The dense weight is dropped, not kept beside the packed one.
    assert not [name for name, _ in model.body.named_parameters()]
    with torch.inference_mode():
        for rows in (token_ids, token_ids[:1, :1], token_ids.reshape(-1)):  # 1-3 dims
            torch.testing.assert_close(
                model(rows), expected.reshape(-1, 11)[: rows.numel()].reshape(*rows.shape, 11)
            )


def test_tied_weights_and_linear_subclasses_are_left_to_torch():
    model = _Toy().eval()
    pack_linears(model, [model])
    assert type(model.scaled) is _Scaled  # its own forward kept
    assert type(model.head) is torch.nn.Linear  # the embeddings hold its weight too
    assert model.head.weight is model.embed.weight


def test_only_the_shapes_asked_for_are_packed():
    model = _Toy().eval()
    assert pack_linears(model, [model.body], shapes={(8, 16)}) == 1
    assert [type(m) for m in model.body] == [torch.nn.Linear, torch.nn.SiLU, OneDnnLinear]


def test_a_linear_reached_twice_is_packed_once():
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared).eval()
    assert pack_linears(model, [model]) == 1
    assert model[0] is model[2] and type(model[0]) is OneDnnLinear


def test_only_float32_on_a_cpu_is_packed():
    assert onednn_applies(torch.device("cpu"), torch.float32)
    assert not onednn_applies(torch.device("cpu"), torch.bfloat16)
    assert not onednn_applies(torch.device("cuda"), torch.float32)


def _last_logits(family, token_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor(token_ids)
    hidden = family.forward(family.embed_tokens(ids), torch.arange(len(ids)).unsqueeze(0))
    return family.compute_logits(hidden[-1:])[0]


def test_a_family_loaded_with_the_onednn_kernel_runs_its_language_model_on_it(demo_model_dir):
    parts = ModelPart.PROCESSOR | ModelPart.LANGUAGE_MODEL
    packed = load_family(str(demo_model_dir), LoadOptions(parts, linear_kernel="onednn"))
    dense = load_family(str(demo_model_dir), LoadOptions(parts))
    assert (packed.linear_kernel, dense.linear_kernel) == ("onednn", "torch")
    modules = list(packed._model.modules())
    assert not [m for m in modules if type(m) is torch.nn.Linear]
    assert sum(type(m) is OneDnnLinear for m in modules) > 0
    prompt = packed.tokenize("a short prompt for the tiny model")
    ours, theirs = _last_logits(packed, prompt), _last_logits(dense, prompt)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert int(ours.argmax()) == int(theirs.argmax())


def test_a_family_in_bfloat16_keeps_torch_linears(demo_model_dir):
    options = LoadOptions(
        ModelPart.PROCESSOR | ModelPart.LANGUAGE_MODEL, dtype=torch.bfloat16, linear_kernel="onednn"
    )
    assert load_family(str(demo_model_dir), options).linear_kernel == "torch"
