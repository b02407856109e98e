"""Resuming a generation on another decoder when its decoder dies mid-stream.

The client has already received some tokens. Another decoder is sent the prompt
followed by those tokens, asked for what is left of the budget, and its tokens continue
the stream: for greedy decoding the answer is exactly the one the dead decoder would
have given (its next token depends only on the tokens before it).

Example: prompt [1, 5, 9], max_tokens 8, 3 tokens [40, 41, 42] received when the
decoder died -> the new decoder gets prompt [1, 5, 9, 40, 41, 42] and max_tokens 5; its
usage (prompt 6, completion 5) is reported as prompt 3, completion 8.

Not resumed (the error goes to the client): structured outputs (the grammar's state
lives in the dead decoder) and presence/frequency penalties (they count output tokens
only, which the new decoder would take for prompt). A seeded sample continues with a
fresh draw from the same seed, so it is a valid sample but not the one an uninterrupted
run gives.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.v1 import common_pb2, decoder_pb2


def can_resume(sampling: common_pb2.SamplingParams) -> bool:
    return (
        not sampling.HasField("structured_output")
        and sampling.presence_penalty == 0
        and sampling.frequency_penalty == 0
    )


def continuation(
    request: decoder_pb2.DecodeRequest, generated: Sequence[int]
) -> decoder_pb2.DecodeRequest:
    """The request that asks another decoder for the rest of the answer."""
    resumed = decoder_pb2.DecodeRequest()
    resumed.CopyFrom(request)
    resumed.prompt_token_ids.extend(generated)
    sampling = resumed.sampling
    if sampling.max_tokens:  # 0: the decoder's own limit, which still bounds the rest
        sampling.max_tokens = max(1, sampling.max_tokens - len(generated))
    sampling.min_tokens = max(0, sampling.min_tokens - len(generated))
    return resumed


def as_one_answer(message: decoder_pb2.DecodeResponse, num_resumed_tokens: int) -> None:
    """The resumed decoder's usage, counted as the client's one request."""
    if num_resumed_tokens and message.HasField("finished"):
        usage = message.finished.usage
        usage.prompt_tokens -= num_resumed_tokens
        usage.completion_tokens += num_resumed_tokens
