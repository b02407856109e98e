"""The decoder in bfloat16: the same code paths as float32 (and as a GPU would run)."""

from __future__ import annotations

import grpc
import torch

from tessera.testbed.cluster import Cluster
from tessera.v1 import common_pb2, decoder_pb2, decoder_pb2_grpc


def test_bfloat16_decoder_agrees_with_float32_where_the_choice_is_clear(demo_model_dir, reference):
    prompt = reference.inputs([("user", ["Describe the sky in five words."])])["input_ids"]
    with torch.inference_mode():
        logits = reference.model(input_ids=prompt).logits[0, -1]
    top2 = torch.topk(logits, 2)
    own = Cluster()
    address = own.start(
        "decoder",
        "decoder",
        [
            "--model",
            str(demo_model_dir),
            "--dtype",
            "bfloat16",
            "--kv-cache-memory-fraction",
            "0.001",
        ],
    )
    try:
        own.wait_ready()
        request = decoder_pb2.DecodeRequest(
            request_id="bf16",
            prompt_token_ids=prompt[0].tolist(),
            sampling=common_pb2.SamplingParams(max_tokens=4, num_top_logprobs=2),
            max_chunk_tokens=5,
        )
        with grpc.insecure_channel(address) as channel:
            responses = list(decoder_pb2_grpc.DecoderServiceStub(channel).Generate(request))
    finally:
        own.stop()
    assert "dtype=bfloat16" in own.log_text("decoder")
    assert "KV cache:" in own.log_text("decoder")
    first = responses[0].tokens.logprobs[0]
    assert responses[-1].finished.usage.completion_tokens == 4
    if float(top2.values[0] - top2.values[1]) > 0.5:  # bfloat16 keeps ~3 digits
        assert first.token_id == int(top2.indices[0])
    reference_logprob = float(torch.log_softmax(logits, -1)[first.token_id])
    assert abs(first.logprob - reference_logprob) < 0.25
