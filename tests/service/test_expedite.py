"""A decoder with nothing to run but an item's rows to wait for tells the item's encoder
(Expedite), which runs it at once on its wide threads, and tells it again once it has
work. The encoder here waits ten minutes for a batch of two to fill: the request is
answered only because the engine, in this process, said it idles; without the call it
would time out."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from decoder_service.request import DecodeSpec
from decoder_service.servicer import metric_readings
from tessera.compute_thread import compute_thread
from tessera.encode_call import encode_announced
from tessera.launcher import free_port
from tessera.testbed.cluster import Cluster
from tessera.testbed.reference import assert_greedy_match, noise_image, to_chat_inputs
from tessera.v1 import encoder_pb2, encoder_pb2_grpc
from tessera.wire import media_item_to_proto
from tests.service.test_engine import (
    MAX_NEW_TOKENS,
    BusyHost,
    decode_spec,
    decoder_family,
    every_thread_or_skip,
    in_process_engine,
    recording_governor,
    run_all,
)


@pytest.fixture(scope="module")
def waiting_encoder(demo_model_dir):
    """An encoder whose batches wait ten minutes to fill, on one thread, two expedited."""
    own = Cluster()
    flags = ["--max-batch-items", "2", "--max-batch-wait-ms", "600000"]
    flags += ["--torch-threads", "1", "--expedite-torch-threads", "2"]
    try:
        own.start("encoder", "encoder", ["--model", str(demo_model_dir), *flags])
        own.wait_ready()
        yield own
    finally:
        own.stop()


def encoded_by_the_gateway_then_run(
    address: str, family, item, engine, *specs: DecodeSpec
) -> tuple[list[list[int]], encoder_pb2.EncoderStats, encoder_pb2.EncoderStats]:
    """The gateway's part: the item sent to `address` to be encoded, and the decode
    requests run once the item is in flight there; their tokens, and the encoder's stats
    after and before."""

    async def scenario():
        announced = asyncio.Event()
        request = encoder_pb2.EncodeRequest(
            items=[media_item_to_proto(item.range, item.data, item.options)],
            model_fingerprint=family.fingerprint,
        )
        async with grpc.aio.insecure_channel(address) as channel:
            stub = encoder_pb2_grpc.EncoderServiceStub(channel)
            before = await stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
            encode = asyncio.create_task(encode_announced(channel, request, 120, announced.set))
            await asyncio.wait_for(announced.wait(), 60)
            tokens = await asyncio.wait_for(run_all(engine, list(specs)), 120)
            await encode
            after = await stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
        return tokens, after, before

    return asyncio.run(scenario())


def test_an_idle_decoder_has_the_item_it_waits_for_encoded_at_once(
    demo_model_dir, waiting_encoder, reference
):
    address = waiting_encoder.address("encoder")
    assert waiting_encoder.ready_field("encoder", "expedite_torch_threads") == "2"
    family, builder = decoder_family(demo_model_dir)
    prompt = [("user", ["Look:", noise_image(7301, 40, 40), "What is in it?"])]
    (item,) = builder.build(to_chat_inputs(prompt)).items
    spec = decode_spec(family, builder, address, 0, prompt, 16)
    engine = in_process_engine(family, ["--model", str(demo_model_dir), "--encoders", address])
    (tokens,), after, before = encoded_by_the_gateway_then_run(address, family, item, engine, spec)
    assert after.num_items_computed - before.num_items_computed == 1
    assert after.num_expedite_calls - before.num_expedite_calls == 1
    assert after.num_expedited_batches - before.num_expedited_batches == 1
    # Idle for the item, then (its rows in, its prompt to run) no longer idle.
    assert engine.prefetcher.expediter.num_calls == 2
    assert_greedy_match(tokens, reference.generate(prompt, MAX_NEW_TOKENS))


def test_an_item_fetched_past_an_encoder_that_is_down_is_expedited_where_it_computes(
    demo_model_dir, waiting_encoder, reference
):
    """The first encoder of the item's order is down (nothing listens there): the
    gateway's Encode went to the next one, and the decoder's fetch moves on to it. That
    encoder hears that the decoder idles for the item (before, only the first choice was
    named, the call failed, and the item waited its ten minutes)."""
    address = waiting_encoder.address("encoder")
    down = f"127.0.0.1:{free_port()}"
    family, builder = decoder_family(demo_model_dir)
    prompt = [("user", ["Past it:", noise_image(7304, 40, 40), "What is in it?"])]
    (item,) = builder.build(to_chat_inputs(prompt)).items
    spec = decode_spec(family, builder, [down, address], 3, prompt, 16)
    flags = ["--model", str(demo_model_dir), "--encoders", f"{down},{address}"]
    engine = in_process_engine(family, flags)
    (tokens,), after, before = encoded_by_the_gateway_then_run(address, family, item, engine, spec)
    assert after.num_items_computed - before.num_items_computed == 1
    assert after.num_expedited_batches - before.num_expedited_batches == 1
    assert_greedy_match(tokens, reference.generate(prompt, MAX_NEW_TOKENS))


@pytest.mark.parametrize("share", [True, False])
def test_forwards_run_on_one_thread_while_an_encoder_on_this_host_computes_their_items(
    demo_model_dir, waiting_encoder, reference, share: bool
):
    """A text request decodes while an image request's item waits at the encoder (its
    batch of two fills in ten minutes; once the text is done the engine idles and has it
    expedited). The host looks idle to the governor throughout, yet with the encoders
    sharing its CPUs every forward runs on one thread while the item computes, and on
    every thread again once its rows are in; with --no-encoders-share-cpus the governor
    alone decides: every thread. The tokens are generate()'s either way."""
    num_threads = every_thread_or_skip()
    address = waiting_encoder.address("encoder")
    family, builder = decoder_family(demo_model_dir)
    prompt = [("user", ["Held:", noise_image(7305 + share, 40, 40), "What is in it?"])]
    (item,) = builder.build(to_chat_inputs(prompt)).items
    image = decode_spec(family, builder, address, 4 + share, prompt, 16)
    text_prompt = [("user", ["Say something about the sea."])]
    text = decode_spec(family, builder, address, 6 + share, text_prompt, 16)
    sharing = "--encoders-share-cpus" if share else "--no-encoders-share-cpus"
    flags = ["--model", str(demo_model_dir), "--encoders", address, sharing]
    engine = in_process_engine(family, flags)
    engine.threads, used = recording_governor(BusyHost(others=0.0), num_threads)
    try:
        (image_tokens, text_tokens), after, before = encoded_by_the_gateway_then_run(
            address, family, item, engine, image, text
        )
    finally:
        compute_thread().call(torch.set_num_threads, num_threads)
    assert after.num_expedited_batches - before.num_expedited_batches == 1  # after the text
    assert used == ([1, num_threads] if share else [])
    readings = {name: value for name, _, _, value in metric_readings(engine)}
    assert (readings["tessera_decoder_forwards_held_to_one_thread_total"] > 0) is share
    assert_greedy_match(image_tokens, reference.generate(prompt, MAX_NEW_TOKENS))
    assert_greedy_match(text_tokens, reference.generate(text_prompt, MAX_NEW_TOKENS))


def test_an_item_the_decoder_sends_again_is_expedited_once_in_flight(
    demo_model_dir, waiting_encoder, reference
):
    """No gateway encoded the item: the decoder's fetch finds nothing and it sends the
    item itself. Its first call came before the item was in flight, and the encoder
    ignored it; once the encoder announces the item in flight the decoder tells it again
    (before, only changes were sent: the item waited its ten minutes)."""
    address = waiting_encoder.address("encoder")
    family, builder = decoder_family(demo_model_dir)
    prompt = [("user", ["Again:", noise_image(7302, 40, 40), "What is in it?"])]
    spec = decode_spec(family, builder, address, 1, prompt, 16)
    engine = in_process_engine(family, ["--model", str(demo_model_dir), "--encoders", address])

    async def scenario() -> tuple[list[int], encoder_pb2.EncoderStats, encoder_pb2.EncoderStats]:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = encoder_pb2_grpc.EncoderServiceStub(channel)
            before = await stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
            (tokens,) = await asyncio.wait_for(run_all(engine, [spec]), 120)
            after = await stub.GetStats(encoder_pb2.GetEncoderStatsRequest(), timeout=10)
        return tokens, after, before

    tokens, after, before = asyncio.run(scenario())
    assert after.num_items_computed - before.num_items_computed == 1
    assert after.num_hashes_verified - before.num_hashes_verified == 1  # sent by a decoder
    assert after.num_expedite_calls - before.num_expedite_calls == 1  # the one heard
    assert after.num_expedited_batches - before.num_expedited_batches == 1
    # Idle for the item (ignored), again once in flight, then no longer idle.
    assert engine.prefetcher.expediter.num_calls == 3
    assert_greedy_match(tokens, reference.generate(prompt, MAX_NEW_TOKENS))


def test_a_failing_listener_of_the_announcement_does_not_fail_the_fetch(
    demo_model_dir, cluster, reference, caplog
):
    """The announcement is advisory: a listener that raises (a bug injected) is logged,
    and the item sent again is still fetched and the request answered exactly."""
    address = cluster.address("encoder")
    family, builder = decoder_family(demo_model_dir)
    prompt = [("user", ["Once more:", noise_image(7303, 40, 40), "What is in it?"])]
    spec = decode_spec(family, builder, address, 2, prompt, 16)
    engine = in_process_engine(family, ["--model", str(demo_model_dir), "--encoders", address])

    def failing(address: str, content_hash: str) -> None:
        raise RuntimeError("injected fault in the announcement's listener")

    engine.embeddings.reencoder.on_announced = failing
    (tokens,) = asyncio.run(asyncio.wait_for(run_all(engine, [spec]), 120))
    assert "injected fault in the announcement's listener" in caplog.text
    assert_greedy_match(tokens, reference.generate(prompt, MAX_NEW_TOKENS))


def test_an_expedite_beyond_its_bounds_is_refused_and_the_encoder_serves_on(waiting_encoder):
    with grpc.insecure_channel(waiting_encoder.address("encoder")) as channel:
        stub = encoder_pb2_grpc.EncoderServiceStub(channel)
        refused = [
            (["ab" * 32] * 257, "d", "at most 256 in one call"),
            ([], "d" * 129, "the decoder_id has 129 characters"),
        ]
        for content_hashes, decoder_id, says in refused:
            request = encoder_pb2.ExpediteRequest(
                content_hashes=content_hashes, decoder_id=decoder_id, sequence=1
            )
            with pytest.raises(grpc.RpcError) as error:
                stub.Expedite(request, timeout=10)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value
            assert says in error.value.details()
        unknown = encoder_pb2.ExpediteRequest(
            content_hashes=["ab" * 32], decoder_id="d", sequence=1
        )
        assert stub.Expedite(unknown, timeout=10).num_in_flight == 0
