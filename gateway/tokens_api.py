"""vLLM's `POST /tokenize` and `POST /detokenize`.

{"model", "prompt": str}    -> {"tokens", "count", "max_model_len"}  (no special tokens,
                               as /v1/completions tokenizes a prompt)
{"model", "messages": [...]} -> the same, for the chat prompt the messages make (chat
                               template, generation prompt, media placeholders)
{"model", "tokens": [int]}  -> {"prompt": str}
"""

from __future__ import annotations

import asyncio

from gateway import fields
from gateway.fields import check_fields
from gateway.front import GatewayFront, Rejected
from gateway.media_fetch import MediaFetchPolicy
from gateway.openai_api import messages_from_body, request_basics


class TokensApi:
    def __init__(self, front: GatewayFront, policy: MediaFetchPolicy):
        self.front, self.policy = front, policy

    @property
    def _family(self):
        return self.front.pipeline.builder.family

    async def tokenize(self, body: object) -> dict:
        check_fields(body, fields.TOKENIZE)
        model, _ = request_basics(body)
        self.front.check_model(model)
        has_prompt, has_messages = "prompt" in body, "messages" in body
        if has_prompt == has_messages:
            raise Rejected("send exactly one of prompt and messages", param="prompt")
        if has_prompt:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise Rejected("prompt must be a string", param="prompt")
            tokens = await asyncio.to_thread(self._family.tokenize, prompt)
        else:
            messages = await messages_from_body(body, self.policy)
            built = await asyncio.to_thread(self.front.pipeline.builder.build, messages)
            tokens = built.token_ids
        return {
            "tokens": tokens,
            "count": len(tokens),
            "max_model_len": self._family.max_model_len,
        }

    async def detokenize(self, body: object) -> dict:
        check_fields(body, fields.DETOKENIZE)
        model, _ = request_basics(body)
        self.front.check_model(model)
        tokens = body.get("tokens")
        vocab = self._family.vocab_size
        if not (
            isinstance(tokens, list)
            and all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in tokens
            )
        ):
            raise Rejected(f"tokens must be a list of token ids in [0, {vocab})", param="tokens")
        return {"prompt": await asyncio.to_thread(self._family.decode_tokens, tokens)}


def _token_id(value: object, vocab: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab
