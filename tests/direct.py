"""Requests built by hand, as the gateway would build them, to send straight to a decoder."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.v1 import common_pb2, decoder_pb2


def image_decode_request(
    prompt: Sequence[int],
    placeholder_token_id: int,
    image: bytes,
    content_hash: str,
    request_id: str,
    hints: Sequence[str] = (),
    max_tokens: int = 6,
    max_chunk_tokens: int = 5,
) -> decoder_pb2.DecodeRequest:
    """A DecodeRequest for a prompt holding one image, whose run of placeholder tokens is
    its range; `hints` are the encoder addresses the gateway would name."""
    positions = [p for p, t in enumerate(prompt) if t == placeholder_token_id]
    return decoder_pb2.DecodeRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        items=[
            decoder_pb2.MediaSource(
                range=common_pb2.PlaceholderRange(
                    modality=common_pb2.MODALITY_IMAGE,
                    content_hash=content_hash,
                    offset=positions[0],
                    length=len(positions),
                ),
                encoder_addresses=list(hints),
                data=image,
            )
        ],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens),
        max_chunk_tokens=max_chunk_tokens,
    )
