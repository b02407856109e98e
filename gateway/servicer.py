"""gRPC face of the gateway: proto <-> domain objects, exceptions -> status codes."""

from __future__ import annotations

import grpc

from gateway.pipeline import (
    DownstreamError,
    FinishedEvent,
    GenerationPipeline,
    GenerationRequest,
    TextEvent,
)
from gateway.prompt import ChatInput, MediaPart, PromptError, TextPart
from tessera.placeholders import Modality
from tessera.server import abort_unless_ready
from tessera.v1 import gateway_pb2, gateway_pb2_grpc


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self) -> None:
        self.pipeline: GenerationPipeline | None = None  # set once the processor is loaded

    async def Generate(self, request, context):
        await abort_unless_ready(context, self.pipeline is not None)
        try:
            generation = GenerationRequest(
                request_id=request.request_id or self.pipeline.new_request_id(),
                messages=[message_from_proto(i, m) for i, m in enumerate(request.messages)],
                sampling=request.sampling,
                max_chunk_tokens=request.max_chunk_tokens,
                timeout_seconds=context.time_remaining(),
                cache_salt=request.cache_salt,
            )
            async for event in self.pipeline.run(generation):
                if isinstance(event, TextEvent):
                    yield gateway_pb2.GenerateResponse(
                        delta=gateway_pb2.TextDelta(
                            text=event.text,
                            token_ids=event.tokens.token_ids,
                            logprobs=event.tokens.logprobs,
                        )
                    )
                elif isinstance(event, FinishedEvent):
                    yield gateway_pb2.GenerateResponse(finished=finished_to_proto(event))
        except PromptError as error:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except DownstreamError as error:
            await context.abort(error.code, str(error))


def message_from_proto(index: int, message: gateway_pb2.ChatMessage) -> ChatInput:
    parts: list[TextPart | MediaPart] = []
    for part_index, part in enumerate(message.content):
        kind = part.WhichOneof("part")
        if kind == "text":
            parts.append(TextPart(part.text))
        elif kind == "image":
            parts.append(MediaPart(Modality.IMAGE, part.image))
        elif kind == "audio":
            parts.append(MediaPart(Modality.AUDIO, part.audio))
        else:
            raise PromptError(
                f"message {index} part {part_index} is empty; set text, image or audio"
            )
    return ChatInput(message.role, parts)


def finished_to_proto(event: FinishedEvent) -> gateway_pb2.GenerateFinished:
    decoder = event.decoder
    return gateway_pb2.GenerateFinished(
        finish_reason=decoder.finish_reason,
        usage=decoder.usage,
        stats=gateway_pb2.RequestStats(
            time_to_first_token_ms=event.time_to_first_token_seconds * 1000,
            num_items=len(event.prompt.items),
            num_items_computed=event.num_items_computed,
            num_items_cached=event.num_items_cached,
            num_embedding_bytes=decoder.stats.num_embedding_bytes,
            decoder=decoder.stats,
        ),
        prompt_token_ids=event.prompt.token_ids,
        token_ids=event.token_ids,
    )
