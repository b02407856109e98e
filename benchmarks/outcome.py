"""What one request gave one arm, and the checks every arm's output goes through."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from tessera.testbed.devices import RunOn


@dataclass
class Outcome:
    token_ids: list[int]
    prompt_token_ids: list[int]
    latency_s: float  # arrival to last token
    ttft_s: float  # arrival to first token
    itl_s: list[float]  # gaps between consecutive tokens
    encoder_passes: int | None = None  # known per request only for in-process arms
    embedding_bytes: int | None = None  # received by the decoder (service arms)
    cached_prompt_tokens: int = 0
    fetch_wait_ms: float = 0.0
    items_computed: int | None = None  # images the encoders computed for this request
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # hf-generate only
    # hf-generate: where it ran, so what counts as a tie (tessera.testbed.devices).
    run_on: RunOn = field(default_factory=RunOn)

    @classmethod
    def from_times(
        cls,
        token_ids: list[int],
        prompt_token_ids: list[int],
        started: float,
        token_times: list[float],
        **extra,
    ) -> Outcome:
        if not token_times:
            raise RuntimeError("a request produced no token")
        return cls(
            token_ids=token_ids,
            prompt_token_ids=prompt_token_ids,
            latency_s=token_times[-1] - started,
            ttft_s=token_times[0] - started,
            itl_s=[b - a for a, b in itertools.pairwise(token_times)],
            **extra,
        )

    def minimum_embedding_bytes(self, placeholder_token_id: int, row_bytes: int) -> int:
        """Rows the decoder had to receive (placeholders it computed, not the ones its
        prefix cache held) x the bytes of a row (every plane, float32)."""
        computed = self.prompt_token_ids[self.cached_prompt_tokens :]
        return computed.count(placeholder_token_id) * row_bytes


class MismatchError(SystemExit):
    """An arm's greedy tokens differ from generate()'s where that is no near-tie."""


def check_tokens(arm: str, request_name: str, mine: Outcome, reference: Outcome) -> bool:
    """Raises MismatchError unless `mine` equals the reference's greedy tokens; a
    difference is allowed only at a true near-tie of the reference (top-2 logits within
    1e-5 in float32; tessera.testbed.devices), and then True is returned (counted and
    reported)."""
    if mine.prompt_token_ids != reference.prompt_token_ids:
        raise MismatchError(
            f"FAIL: {arm} built another prompt than generate() for {request_name}:\n"
            f"  {arm:<20} {mine.prompt_token_ids[:40]}...\n"
            f"  {'generate':<20} {reference.prompt_token_ids[:40]}..."
        )
    if mine.token_ids == reference.token_ids:
        return False
    for step, (ours, theirs) in enumerate(zip(mine.token_ids, reference.token_ids, strict=False)):
        if ours == theirs:
            continue
        top2 = torch.topk(reference.logits[step], 2).values
        gap = float(top2[0] - top2[1])
        if gap < reference.run_on.near_tie(float(top2[0])):
            return True
        raise MismatchError(
            f"FAIL: {arm} differs from generate() on {request_name} at step {step} "
            f"(top-2 logit gap {gap:.3g}: no near-tie):\n"
            f"  {arm:<20} {mine.token_ids}\n  {'generate':<20} {reference.token_ids}"
        )
    raise MismatchError(
        f"FAIL: {arm} produced {len(mine.token_ids)} tokens on {request_name}, generate() "
        f"{len(reference.token_ids)}:\n  {mine.token_ids}\n  {reference.token_ids}"
    )
