"""The batched sampler: each processor equals transformers' own on the same logits, the
whole chain equals HF's chain in generate()'s order, and a batch of mixed rows samples
exactly what each row would alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from decoder_service import sampler
from decoder_service.request import SamplingOptions
from decoder_service.sampler import SamplerRow, TokenCounts, sample_batch

VOCAB = 32
PROMPT = [3, 5, 5, 9, 30]
OUTPUT = [7, 3, 7, 7, 12]
EOS = (2, 31)


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def input_ids() -> torch.Tensor:
    return torch.tensor([PROMPT + OUTPUT])


def row(seed: int = 0, num_output: int = len(OUTPUT), **kwargs) -> SamplerRow:
    options = SamplingOptions(max_tokens=64, **kwargs)
    counts = TokenCounts(VOCAB, PROMPT, torch.device("cpu"))
    for token in OUTPUT[:num_output]:
        counts.add(token)
    return SamplerRow(
        options,
        torch.Generator().manual_seed(seed),
        num_output_tokens=num_output,
        min_tokens_suppress=EOS,
        counts=counts,
    )


def hf(processor, logits: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
    return processor(input_ids() if ids is None else ids, logits.clone())


def test_repetition_penalty_equals_hf():
    penalties = [1.3, 0.7, 1.0, 2.0]
    logits = random_logits(len(penalties))
    ours = logits.clone()
    sampler.apply_repetition_penalty(ours, [row(repetition_penalty=p) for p in penalties])
    for i, penalty in enumerate(penalties):
        expected = hf(RepetitionPenaltyLogitsProcessor(penalty), logits[i : i + 1])
        torch.testing.assert_close(ours[i : i + 1], expected, rtol=0, atol=0)
    assert not torch.equal(ours[0], logits[0])  # the comparison would see a no-op


@pytest.mark.parametrize("num_output", [0, 2, 4, 5])
def test_min_tokens_equals_hf(num_output):
    logits = random_logits(1)
    ours = logits.clone()
    sampler.apply_min_tokens(ours, [row(num_output=num_output, min_tokens=5)])
    processor = MinNewTokensLengthLogitsProcessor(len(PROMPT), 5, list(EOS))
    ids = torch.tensor([PROMPT + OUTPUT[:num_output]])
    torch.testing.assert_close(ours, hf(processor, logits, ids), rtol=0, atol=0)
    assert bool(torch.isinf(ours[0, list(EOS)]).all()) == (num_output < 5)


def test_logit_bias_equals_hf_sequence_bias():
    bias = ((4, 100.0), (9, -3.5), (17, 0.25))
    logits = random_logits(2)
    ours = logits.clone()
    sampler.apply_logit_bias(ours, [row(logit_bias=bias), row()])
    processor = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias])
    torch.testing.assert_close(ours[:1], hf(processor, logits[:1]), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[1], logits[1], rtol=0, atol=0)


def test_frequency_and_presence_penalties_follow_openai():
    logits = random_logits(1)
    ours = logits.clone()
    sampler.apply_frequency_presence(ours, [row(frequency_penalty=0.5, presence_penalty=1.5)])
    expected = logits.clone()
    for token in set(OUTPUT):  # prompt tokens are not penalized, output ones per count
        expected[0, token] -= 0.5 * OUTPUT.count(token) + 1.5
    torch.testing.assert_close(ours, expected)


@pytest.mark.parametrize(
    ("processor", "apply", "values"),
    [
        (TopKLogitsWarper, sampler.apply_top_k, [3, 1, 31, 100]),
        (TopPLogitsWarper, sampler.apply_top_p, [0.9, 0.5, 0.05, 1.0]),
        (MinPLogitsWarper, sampler.apply_min_p, [0.05, 0.3, 1.0, 0.0]),
    ],
)
def test_warpers_equal_hf_row_by_row(processor, apply, values):
    # Also many random settings, so a bound off by a little shows on some row.
    spread = torch.rand(200, generator=torch.Generator().manual_seed(2)).tolist()
    values = values + [1 + round(v * VOCAB) if isinstance(values[0], int) else v for v in spread]
    logits = random_logits(len(values), seed=1)
    ours = logits.clone()
    apply(ours, values)
    for i, value in enumerate(values):
        expected = hf(processor(value), logits[i : i + 1])
        torch.testing.assert_close(ours[i : i + 1], expected, rtol=0, atol=0)


def test_off_values_leave_the_logits_alone():
    logits = random_logits(1)
    ours = logits.clone()
    sampler.apply_top_k(ours, [0])
    sampler.apply_top_p(ours, [1.0])
    sampler.apply_min_p(ours, [0.0])
    sampler.apply_repetition_penalty(ours, [row()])
    torch.testing.assert_close(ours, logits, rtol=0, atol=0)


def test_the_whole_chain_equals_hf_in_generates_order():
    bias = ((2, 10.0), (11, -1.0))  # EOS (2) would win but for min_tokens
    options = dict(
        logit_bias=bias,
        min_tokens=8,
        repetition_penalty=1.4,
        temperature=0.7,
        top_k=12,
        top_p=0.8,
        min_p=0.05,
    )
    logits = random_logits(1, seed=3)
    ours = sampler.process(logits.clone(), [row(**options)])
    chain = LogitsProcessorList(
        [
            SequenceBiasLogitsProcessor([[[t], b] for t, b in bias]),
            MinNewTokensLengthLogitsProcessor(len(PROMPT), 8, list(EOS)),
            RepetitionPenaltyLogitsProcessor(1.4),
            TemperatureLogitsWarper(0.7),
            TopKLogitsWarper(12),
            TopPLogitsWarper(0.8),
            MinPLogitsWarper(0.05),
        ]
    )
    torch.testing.assert_close(ours, hf(chain, logits), rtol=0, atol=1e-6)


def mixed_rows(seed: int) -> list[SamplerRow]:
    return [
        row(seed, temperature=0.0, repetition_penalty=1.5),
        row(seed + 1, temperature=0.9, top_k=5, num_top_logprobs=3),
        row(seed + 2, temperature=1.3, top_p=0.7, frequency_penalty=1.0, presence_penalty=0.5),
        row(seed + 3, temperature=0.8, min_p=0.1, logit_bias=((6, 5.0),)),
        row(seed + 4, temperature=1.0, min_tokens=9, num_output=3),
    ]


def test_a_mixed_batch_samples_what_each_row_would_alone():
    batch_rows, alone_rows = mixed_rows(10), mixed_rows(10)
    for step in range(20):
        logits = random_logits(len(batch_rows), seed=100 + step)
        batched = sample_batch(logits, batch_rows)
        alone = [sample_batch(logits[i : i + 1], [r])[0] for i, r in enumerate(alone_rows)]
        assert batched == alone


def test_a_seed_repeats_and_another_seed_differs():
    def draws(seed: int) -> list[int]:
        rows = [row(seed, temperature=1.0)]
        return [sample_batch(random_logits(1, seed=s), rows)[0].token_id for s in range(30)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)


def test_logprobs_are_the_models_own_before_every_processor():
    logits = random_logits(1)
    token = sample_batch(logits, [row(repetition_penalty=1.8, logit_bias=((4, 100.0),))])[0]
    assert token.token_id == 4
    expected = torch.log_softmax(logits[0], dim=-1)[4]
    assert token.logprob == pytest.approx(float(expected), abs=1e-6)


def test_logit_bias_forces_a_token_in_a_draw():
    rows = [row(seed, temperature=1.0, logit_bias=((13, 100.0),)) for seed in range(8)]
    assert {t.token_id for t in sample_batch(random_logits(8), rows)} == {13}


def test_allowed_tokens_mask_is_applied_after_every_processor():
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[[8, 20]] = True
    greedy = dataclasses.replace(row(logit_bias=((4, 100.0),)), allowed_tokens_mask=mask)
    sampled = dataclasses.replace(row(1, temperature=1.0), allowed_tokens_mask=mask)
    logits = random_logits(2)
    tokens = sample_batch(logits, [greedy, sampled])
    assert tokens[0].token_id == (8 if logits[0, 8] > logits[0, 20] else 20)
    assert tokens[1].token_id in (8, 20)


def test_min_tokens_yields_to_a_grammar_that_can_only_end():
    """min_tokens holds EOS back while the grammar allows another token; once the grammar
    allows only EOS, EOS is sampled (not a row with every logit -inf)."""
    only_eos, eos_or_other = (
        torch.zeros(VOCAB, dtype=torch.bool),
        torch.zeros(VOCAB, dtype=torch.bool),
    )
    only_eos[EOS[0]] = True
    eos_or_other[[EOS[0], 17]] = True
    logits = random_logits(2)
    logits[:, EOS[0]] = 50.0  # EOS would win wherever it is allowed
    rows = [
        dataclasses.replace(row(num_output=1, min_tokens=9), allowed_tokens_mask=only_eos),
        dataclasses.replace(row(num_output=1, min_tokens=9), allowed_tokens_mask=eos_or_other),
    ]
    assert [t.token_id for t in sample_batch(logits, rows)] == [EOS[0], 17]


def test_token_counts_grow_with_each_added_token():
    counts = TokenCounts(VOCAB, [1, 1, 2], torch.device("cpu"))
    assert counts.seen[[1, 2]].all() and not counts.seen[3] and not counts.output.any()
    counts.add(3)
    counts.add(3)
    assert counts.seen[3] and counts.output[3] == 2 and counts.output[1] == 0
