"""gRPC face of the gateway: proto <-> domain objects, exceptions -> status codes."""

from __future__ import annotations

import grpc

from gateway.api_keys import ApiKeys, UnauthenticatedError
from gateway.front import ChatRequest, GatewayFront, Outcome, Rejected
from gateway.pipeline import DownstreamError, GenerationPipeline
from gateway.prompt import ChatInput, MediaPart, PromptError, TextPart
from tessera.limits import check_request_id
from tessera.placeholders import Modality
from tessera.server import abort_unless_ready
from tessera.v1 import common_pb2, decoder_pb2, gateway_pb2, gateway_pb2_grpc

REQUEST_ID_KEY = "x-request-id"


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self) -> None:
        self.front: GatewayFront | None = None  # set once the processor is loaded
        self.api_keys = ApiKeys()

    async def Generate(self, request, context):
        await abort_unless_ready(context, self.front is not None)
        request_id = request.request_id or _metadata(context, REQUEST_ID_KEY)
        request_id = request_id or GenerationPipeline.new_request_id()
        try:
            tenant = self.api_keys.tenant_for(_metadata(context, "authorization"))
        except UnauthenticatedError as error:
            # Logged under an id of our own: the caller's is not checked yet.
            own_id = GenerationPipeline.new_request_id()
            await self._refuse(context, own_id, grpc.StatusCode.UNAUTHENTICATED, error)
        try:
            check_request_id(request_id)
        except ValueError as error:
            # Logged under an id of our own: a bad one is never echoed.
            own_id = GenerationPipeline.new_request_id()
            await self._refuse(context, own_id, grpc.StatusCode.INVALID_ARGUMENT, error)
        await context.send_initial_metadata([(REQUEST_ID_KEY, request_id)])
        try:
            chat = ChatRequest(
                request_id=request_id,
                model=request.model,
                messages=[message_from_proto(i, m) for i, m in enumerate(request.messages)],
                sampling=request.sampling,
                stop=list(request.stop),
                max_chunk_tokens=request.max_chunk_tokens,
                cache_salt=request.cache_salt,
                tenant=tenant,
                timeout_seconds=context.time_remaining(),
                processing_options=dict(request.mm_processor_kwargs),
            )
        except PromptError as error:
            await self._refuse(context, request_id, grpc.StatusCode.INVALID_ARGUMENT, error)
        # From here on, the front counts and logs the request however it ends.
        outcome = Outcome()
        try:
            async for text, event in self.front.generate(chat, outcome):
                yield gateway_pb2.GenerateResponse(
                    delta=gateway_pb2.TextDelta(
                        text=text, token_ids=event.tokens.token_ids, logprobs=event.tokens.logprobs
                    )
                )
            yield gateway_pb2.GenerateResponse(finished=finished_to_proto(outcome))
        except (PromptError, Rejected) as error:
            await context.abort(
                getattr(error, "code", grpc.StatusCode.INVALID_ARGUMENT), str(error)
            )
        except DownstreamError as error:
            await context.abort(error.code, str(error))

    async def _refuse(
        self, context, request_id: str, code: grpc.StatusCode, error: Exception
    ) -> None:
        """A request refused before generation: counted and logged, then aborted."""
        self.front.refused(request_id, "grpc", code.name)
        await context.abort(code, str(error))


def _metadata(context, key: str) -> str:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value
    return ""


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
        elif kind == "video":
            parts.append(MediaPart(Modality.VIDEO, part.video))
        else:
            raise PromptError(
                f"message {index} part {part_index} is empty; set text, image, audio or video"
            )
    return ChatInput(message.role, parts)


def finished_to_proto(outcome: Outcome) -> gateway_pb2.GenerateFinished:
    prompt, finished = outcome.prompt, outcome.finished
    decoder = finished.decoder.stats if finished else decoder_pb2.DecodeStats()
    reason = (
        common_pb2.FINISH_REASON_STOP
        if outcome.finish_reason == "stop"
        else common_pb2.FINISH_REASON_LENGTH
    )
    return gateway_pb2.GenerateFinished(
        finish_reason=reason,
        usage=common_pb2.Usage(
            prompt_tokens=len(prompt.token_ids),
            completion_tokens=len(outcome.token_ids),
            cached_prompt_tokens=decoder.num_cached_prompt_tokens,
        ),
        stats=gateway_pb2.RequestStats(
            time_to_first_token_ms=finished.time_to_first_token_seconds * 1000 if finished else 0,
            num_items=len(prompt.items),
            num_items_computed=finished.num_items_computed if finished else 0,
            num_items_cached=finished.num_items_cached if finished else 0,
            num_embedding_bytes=decoder.num_embedding_bytes,
            decoder=decoder,
        ),
        prompt_token_ids=prompt.token_ids,
        token_ids=outcome.token_ids,
    )
