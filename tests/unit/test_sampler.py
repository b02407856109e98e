"""Choosing the next token: greedy, temperature, top-k, top-p, seeds and logprobs."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from decoder_service.request import SamplingOptions
from decoder_service.sampler import sample

LOGITS = torch.tensor([0.5, 2.0, -1.0, 1.5, 0.0, 3.0, -2.0, 1.0])
ARGMAX = 5
DRAWS = 400


def options(**kwargs) -> SamplingOptions:
    return SamplingOptions(max_tokens=16, **kwargs)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def draws(logits: torch.Tensor, opts: SamplingOptions, seed: int = 0, n: int = DRAWS) -> Counter:
    gen = generator(seed)
    return Counter(sample(logits, opts, gen).token_id for _ in range(n))


def logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs).log()


def test_greedy_is_argmax():
    assert sample(LOGITS, options(), generator()).token_id == ARGMAX
    shuffled = LOGITS[[3, 0, 5, 1, 7, 2, 6, 4]]
    assert sample(shuffled, options(), generator()).token_id == int(shuffled.argmax())


def test_logprob_is_log_softmax_at_the_token():
    for opts in [options(), options(temperature=1.0)]:
        token = sample(LOGITS, opts, generator())
        expected = torch.log_softmax(LOGITS, dim=-1)[token.token_id]
        assert token.logprob == pytest.approx(float(expected), abs=1e-6)


def test_logprob_is_under_the_model_distribution_not_the_tempered_one():
    token = sample(LOGITS, options(temperature=0.1, top_k=1), generator())
    assert token.logprob == pytest.approx(float(torch.log_softmax(LOGITS, -1)[ARGMAX]), abs=1e-6)


def test_half_precision_logits_are_accepted():
    token = sample(LOGITS.to(torch.bfloat16), options(num_top_logprobs=2), generator())
    assert token.token_id == ARGMAX and math.isfinite(token.logprob)


@pytest.mark.parametrize("count", [1, 3, 8])
def test_top_logprobs_sorted_with_the_right_count(count):
    token = sample(LOGITS, options(num_top_logprobs=count), generator())
    assert len(token.top) == count
    values = [entry.logprob for entry in token.top]
    assert values == sorted(values, reverse=True)
    assert token.top[0].token_id == ARGMAX
    expected_ids = torch.argsort(LOGITS, descending=True)[:count].tolist()
    assert [entry.token_id for entry in token.top] == expected_ids
    log_softmax = torch.log_softmax(LOGITS, -1)
    for entry in token.top:
        assert entry.logprob == pytest.approx(float(log_softmax[entry.token_id]), abs=1e-6)


def test_no_top_logprobs_unless_asked():
    assert sample(LOGITS, options(), generator()).top == ()


def test_top_k_one_always_picks_argmax():
    assert draws(LOGITS, options(temperature=1.5, top_k=1), n=100) == Counter({ARGMAX: 100})


def test_tiny_top_p_always_picks_argmax():
    assert draws(LOGITS, options(temperature=1.5, top_p=1e-6), n=100) == Counter({ARGMAX: 100})


def test_same_seed_repeats_the_draws():
    opts = options(temperature=1.0)

    def sequence(seed: int) -> list[int]:
        gen = generator(seed)
        return [sample(LOGITS, opts, gen).token_id for _ in range(50)]

    assert sequence(7) == sequence(7)
    assert sequence(8) != sequence(7)


def test_top_k_restricts_draws_to_the_k_best():
    counts = draws(LOGITS, options(temperature=2.0, top_k=3))
    assert set(counts) == {5, 1, 3}  # logits 3.0, 2.0, 1.5


def test_top_k_larger_than_vocab_keeps_everything():
    flat = torch.zeros(4)
    assert set(draws(flat, options(temperature=1.0, top_k=10))) == {0, 1, 2, 3}


def test_top_p_keeps_the_minimal_nucleus():
    logits = logits_of([0.2, 0.5, 0.3])
    counts = draws(logits, options(temperature=1.0, top_p=0.75))
    assert set(counts) == {1, 2}  # 0.5 + 0.3 reaches 0.75; 0.2 is not needed


def test_top_p_nucleus_grows_with_top_p():
    logits = logits_of([0.5, 0.3, 0.2])
    assert set(draws(logits, options(temperature=1.0, top_p=0.45))) == {0}
    assert set(draws(logits, options(temperature=1.0, top_p=0.55))) == {0, 1}
    assert set(draws(logits, options(temperature=1.0, top_p=0.75))) == {0, 1}
    assert set(draws(logits, options(temperature=1.0, top_p=0.85))) == {0, 1, 2}


def test_full_top_p_keeps_everything():
    logits = logits_of([0.4, 0.3, 0.2, 0.1])
    assert set(draws(logits, options(temperature=1.0, top_p=1.0))) == {0, 1, 2, 3}


def test_draw_frequencies_follow_the_probabilities():
    logits = logits_of([0.6, 0.3, 0.1])
    counts = draws(logits, options(temperature=1.0), n=2000)
    assert counts[0] > counts[1] > counts[2] > 0
    assert 0.5 < counts[0] / 2000 < 0.7


def test_low_temperature_concentrates_on_argmax():
    counts = draws(LOGITS, options(temperature=0.05), n=200)
    assert counts[ARGMAX] == 200
