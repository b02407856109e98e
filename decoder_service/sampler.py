"""Choosing the next token from one request's logits."""

from __future__ import annotations

import torch

from decoder_service.request import SampledToken, SamplingOptions, TopLogprob


def sample(
    logits: torch.Tensor,
    options: SamplingOptions,
    generator: torch.Generator,
    allowed: torch.Tensor | None = None,
) -> SampledToken:
    """Greedy when temperature is 0; else temperature, then top-k, then top-p, then a draw
    from the request's own generator (so a seed reproduces the output). `allowed` (a bool
    mask, e.g. a grammar's) drops every other token before anything else.

    Log-probabilities are reported under the model's own distribution (before the mask,
    temperature and filtering), as OpenAI's API reports them.
    """
    logits = logits.float()
    model_logits = logits
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if options.is_greedy:
        token_id = int(torch.argmax(logits))
    else:
        probs = torch.softmax(_filtered(logits / options.temperature, options), dim=-1)
        token_id = int(torch.multinomial(probs, 1, generator=generator))
    logprobs = torch.log_softmax(model_logits, dim=-1)
    top: tuple[TopLogprob, ...] = ()
    if options.num_top_logprobs:
        values, ids = torch.topk(logprobs, options.num_top_logprobs)
        top = tuple(TopLogprob(int(i), float(v)) for v, i in zip(values, ids, strict=True))
    return SampledToken(token_id, float(logprobs[token_id]), top)


def _filtered(logits: torch.Tensor, options: SamplingOptions) -> torch.Tensor:
    if 0 < options.top_k < logits.numel():
        kth = torch.topk(logits, options.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0 < options.top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first always stays.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= options.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
