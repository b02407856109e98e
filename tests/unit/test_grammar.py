"""decoder_service/grammar.py with the demo tokenizer: compiling, the mask, advancing,
termination and bad grammars."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from decoder_service.grammar import (
    GrammarCompiler,
    GrammarKind,
    GrammarSpec,
    allowed_tokens_batch,
    grammar_spec_from_proto,
)
from decoder_service.request import SamplingOptions
from decoder_service.sampler import sample
from tessera.demo_models.llava import build_tokenizer_for_llava
from tessera.limits import MAX_GRAMMAR_CHARS
from tessera.v1 import common_pb2

# The model's vocabulary is padded past the tokenizer's, as many checkpoints' are.
PADDING = 40

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pet": {"enum": ["cat", "dog", "bird"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer_for_llava()


@pytest.fixture(scope="module")
def compiler(tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer) + PADDING, [tokenizer.eos_token_id])


def run(compiler, spec, seed: int, max_tokens: int = 400, temperature: float = 1.0):
    """Samples random logits through the grammar until it terminates; returns the ids."""
    matcher = compiler.matcher(spec)
    generator = torch.Generator().manual_seed(seed)
    options = SamplingOptions(max_tokens=max_tokens, temperature=temperature)
    ids = []
    for _ in range(max_tokens):
        logits = torch.randn(compiler.model_vocab_size, generator=generator) * 4
        token = sample(logits, options, generator, matcher.allowed_tokens(logits.numel()))
        matcher.advance(token.token_id)
        ids.append(token.token_id)
        if matcher.is_terminated:
            return ids
    raise AssertionError(f"the grammar did not terminate in {max_tokens} tokens")


def first_id(tokenizer, text: str) -> int:
    return tokenizer(text, add_special_tokens=False)["input_ids"][0]


def text_of(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("seed", range(4))
def test_schema_output_validates(compiler, tokenizer, seed):
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA))
    value = json.loads(text_of(tokenizer, run(compiler, spec, seed)))
    jsonschema.validate(value, SCHEMA)


def test_json_object_and_regex_and_lark(compiler, tokenizer):
    value = json.loads(text_of(tokenizer, run(compiler, GrammarSpec(GrammarKind.JSON_OBJECT), 1)))
    assert isinstance(value, dict)
    regex = GrammarSpec(GrammarKind.REGEX, r"(red|blue) [0-9]{3}")
    assert text_of(tokenizer, run(compiler, regex, 2)) in {
        f"{c} {n:03d}" for c in ("red", "blue") for n in range(1000)
    }
    lark = GrammarSpec(GrammarKind.LARK, 'start: "yes" | "no"')
    assert text_of(tokenizer, run(compiler, lark, 3)) in {"yes", "no"}


def test_without_the_mask_random_logits_are_not_json(compiler, tokenizer):
    """The check the tests above rely on: unconstrained output of these logits is garbage."""
    generator = torch.Generator().manual_seed(0)
    options = SamplingOptions(max_tokens=30, temperature=1.0)
    ids = [
        sample(torch.randn(compiler.model_vocab_size, generator=generator), options, generator)
        for _ in range(30)
    ]
    with pytest.raises(json.JSONDecodeError):
        json.loads(text_of(tokenizer, [t.token_id for t in ids]))


def test_mask_never_allows_ids_past_the_tokenizer(compiler, tokenizer):
    matcher = compiler.matcher(GrammarSpec(GrammarKind.JSON_OBJECT))
    allowed = matcher.allowed_tokens(compiler.model_vocab_size)
    assert allowed.shape == (compiler.model_vocab_size,)
    assert not allowed[len(tokenizer) :].any()
    # At the start of an object only "{" (and whitespace) may come: a real restriction.
    assert 0 < int(allowed.sum()) < len(tokenizer) // 10
    assert allowed[first_id(tokenizer, "{")]
    assert not allowed[first_id(tokenizer, "the")]


def test_terminates_when_complete_and_refuses_more(compiler, tokenizer):
    matcher = compiler.matcher(GrammarSpec(GrammarKind.REGEX, "ab"))
    for token_id in tokenizer("ab", add_special_tokens=False)["input_ids"]:
        assert not matcher.is_terminated
        matcher.advance(token_id)
    assert matcher.is_accepting
    # The regex is complete, but EOS may still come: llguidance stops at EOS.
    if not matcher.is_terminated:
        allowed = matcher.allowed_tokens(compiler.model_vocab_size)
        assert allowed.nonzero().flatten().tolist() == [tokenizer.eos_token_id]
        matcher.advance(tokenizer.eos_token_id)
    assert matcher.is_terminated


def test_a_refused_token_is_an_error(compiler, tokenizer):
    matcher = compiler.matcher(GrammarSpec(GrammarKind.JSON_OBJECT))
    with pytest.raises(RuntimeError, match="refused"):
        matcher.advance(first_id(tokenizer, "the"))


def test_logprobs_are_the_unmasked_models(compiler):
    matcher = compiler.matcher(GrammarSpec(GrammarKind.JSON_OBJECT))
    logits = torch.randn(compiler.model_vocab_size, generator=torch.Generator().manual_seed(5))
    allowed = matcher.allowed_tokens(logits.numel())
    token = sample(logits, SamplingOptions(max_tokens=1, num_top_logprobs=3), None, allowed)
    assert allowed[token.token_id]
    expected = torch.log_softmax(logits, dim=-1)
    assert token.logprob == pytest.approx(float(expected[token.token_id]), abs=1e-6)
    assert token.top[0].token_id == int(expected.argmax())


def test_each_request_gets_its_own_matcher_and_the_grammar_is_cached(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id], cache_size=2)
    spec = GrammarSpec(GrammarKind.REGEX, "ab")
    first, second = compiler.matcher(spec), compiler.matcher(spec)
    first.advance(tokenizer("a", add_special_tokens=False)["input_ids"][0])
    assert second.allowed_tokens(len(tokenizer)).sum() < len(tokenizer)
    assert compiler.num_cached == 1
    for text in ("a", "b", "c"):
        compiler.matcher(GrammarSpec(GrammarKind.REGEX, text))
    assert compiler.num_cached == 2  # bounded


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (GrammarSpec(GrammarKind.JSON_SCHEMA, "{not json"), "structured_output.json_schema"),
        (GrammarSpec(GrammarKind.JSON_SCHEMA, '{"type": "foo"}'), "foo"),
        (
            GrammarSpec(GrammarKind.JSON_SCHEMA, '{"properties": {"a": {"$ref": "#/nope"}}}'),
            "nope",
        ),
        (GrammarSpec(GrammarKind.REGEX, "a(b"), "structured_output.regex"),
        (GrammarSpec(GrammarKind.LARK, "start: undefined_rule"), "undefined_rule"),
    ],
)
def test_bad_grammars_are_value_errors_naming_the_field(compiler, spec, message):
    with pytest.raises(ValueError, match="structured_output") as caught:
        compiler.matcher(spec)
    assert message in str(caught.value)


def test_spec_from_proto():
    assert grammar_spec_from_proto(common_pb2.StructuredOutput()) is None
    assert grammar_spec_from_proto(common_pb2.StructuredOutput(json_object=True)) == GrammarSpec(
        GrammarKind.JSON_OBJECT
    )
    assert grammar_spec_from_proto(common_pb2.StructuredOutput(regex="a+")) == GrammarSpec(
        GrammarKind.REGEX, "a+"
    )
    with pytest.raises(ValueError, match=r"structured_output\.json_object"):
        grammar_spec_from_proto(common_pb2.StructuredOutput(json_object=False))
    with pytest.raises(ValueError, match=r"structured_output\.lark is empty"):
        grammar_spec_from_proto(common_pb2.StructuredOutput(lark="  "))
    with pytest.raises(ValueError, match="at most"):
        grammar_spec_from_proto(common_pb2.StructuredOutput(regex="a" * (MAX_GRAMMAR_CHARS + 1)))


def test_a_tokenizer_llguidance_cannot_read_is_refused():
    compiler = GrammarCompiler(object(), 100, [0])
    with pytest.raises(ValueError, match="not supported for this model's tokenizer"):
        compiler.matcher(GrammarSpec(GrammarKind.JSON_OBJECT))


def test_masks_filled_together_equal_masks_filled_alone(compiler, tokenizer):
    """One parallel fill for a step's structured requests, each at its own place in its
    own grammar, gives every request the mask it would have had alone."""
    specs = [
        GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA)),
        GrammarSpec(GrammarKind.REGEX, r"(yes|no) [0-9]{2,4}"),
        GrammarSpec(GrammarKind.JSON_OBJECT, ""),
    ]
    matchers = [compiler.matcher(spec) for spec in specs]
    prefixes = ['{"name": "Al', "yes 1", '{"a": [1, ']
    for matcher, prefix in zip(matchers, prefixes, strict=True):
        for token_id in tokenizer(prefix, add_special_tokens=False)["input_ids"]:
            matcher.advance(token_id)
    vocab_size = compiler.model_vocab_size
    together = allowed_tokens_batch(matchers, vocab_size)
    alone = [matcher.allowed_tokens(vocab_size) for matcher in matchers]
    assert len({mask.sum().item() for mask in alone}) == 3  # three different places
    for mine, theirs in zip(together, alone, strict=True):
        assert torch.equal(mine, theirs)
