"""`Encode` as its callers make it: told as soon as the encoder has the items in flight.

The gateway sends the decode request only then (gateway.encode_dispatch); a decoder that
sends an item again (its encoder lost it) tells that encoder then that it idles for it
(decoder_service.expedite).
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from tessera.v1 import encoder_pb2

_ENCODE = encoder_pb2.DESCRIPTOR.services_by_name["EncoderService"].methods_by_name["Encode"]
ENCODE_METHOD = f"/{_ENCODE.containing_service.full_name}/{_ENCODE.name}"


async def encode_announced(
    channel: grpc.aio.Channel,
    request: encoder_pb2.EncodeRequest,
    timeout: float | None,
    announced: Callable[[], None],
) -> encoder_pb2.EncodeResponse:
    """`Encode` on `channel`; calls `announced` as soon as the encoder has the items in
    flight (its early initial metadata), not when the call ends. Raises AioRpcError as
    the unary call would.

    The call is made as a server-streaming call of one response. gRPC's unary client
    asks for the initial metadata and the response in one batch of operations, so a
    unary `Encode` hands its caller the announcement only with the rows' arrival: the
    decode request then waited for the whole encode (a 1536 px image: ~130 ms). On the
    wire both are the same HTTP/2 stream, so the encoder's unary handler serves either.
    """
    method = channel.unary_stream(
        ENCODE_METHOD,
        request_serializer=encoder_pb2.EncodeRequest.SerializeToString,
        response_deserializer=encoder_pb2.EncodeResponse.FromString,
    )
    call = method(request, timeout=timeout)
    await call.initial_metadata()
    if not call.done() or await call.code() == grpc.StatusCode.OK:
        announced()  # not for a call that failed: the caller's next try announces
    responses = [response async for response in call]
    if len(responses) != 1:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.INTERNAL,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details=f"Encode answered {len(responses)} messages, not one",
        )
    return responses[0]
