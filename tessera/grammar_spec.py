"""What a structured output asks for, as llguidance's grammar text: shared by the gateway
(which checks a grammar before sending it, so a bad one is a 400 naming the request's
field) and the decoder (which compiles it against its tokenizer, decoder_service/grammar.py).
No torch here: the check needs no tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import llguidance

from tessera.sampling import check_structured_output
from tessera.v1 import common_pb2


class GrammarKind(Enum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    LARK = "lark"


@dataclass(frozen=True)
class GrammarSpec:
    """What the output must follow: `text` is the schema, regex or Lark grammar (empty for
    any JSON object). Hashable: it is the compile cache's key."""

    kind: GrammarKind
    text: str = ""


# Any JSON object: the same compiler as a schema, so both behave alike.
_ANY_OBJECT_SCHEMA = '{"type": "object"}'
# JSON is written in one line with json.dumps' separators: free whitespace lets a weak
# model emit newlines forever and never close the object. (A schema's own "x-guidance"
# options, llguidance's extension, may still ask for other whitespace.)
_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_spec_from_proto(message: common_pb2.StructuredOutput) -> GrammarSpec | None:
    """None when no kind is set (unconstrained). Raises ValueError naming the field."""
    check_structured_output(message)
    kind = message.WhichOneof("kind")
    if kind is None:
        return None
    if kind == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT)
    return GrammarSpec(GrammarKind(kind), getattr(message, kind))


def grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for `spec` (not yet checked: building a matcher checks it)."""
    if spec.kind is GrammarKind.JSON_OBJECT:
        return llguidance.LLMatcher.grammar_from_json_schema(
            _ANY_OBJECT_SCHEMA, defaults=_JSON_DEFAULTS
        )
    if spec.kind is GrammarKind.JSON_SCHEMA:
        return llguidance.LLMatcher.grammar_from_json_schema(spec.text, defaults=_JSON_DEFAULTS)
    if spec.kind is GrammarKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec.text)
    return llguidance.LLMatcher.grammar_from_lark(spec.text)


def grammar_error(message: common_pb2.StructuredOutput) -> str:
    """llguidance's complaint about the grammar `message` asks for ("" when it is sound),
    checked without a tokenizer (about a millisecond for a typical schema)."""
    spec = grammar_spec_from_proto(message)
    if spec is None:
        return ""
    try:
        return llguidance.LLMatcher.validate_grammar(grammar_text(spec))
    except ValueError as error:  # e.g. a schema that is not JSON
        return str(error)
