"""The hermes tool-call parser: whole outputs, and streams that must reassemble to them."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.tool_calls import HermesStream, merge_deltas, parse_tool_calls


def call_text(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


WEATHER = call_text("get_weather", {"city": "Paris", "days": 2})
TIME = call_text("get_time", {"zone": "Europe/Paris"})


def named(message) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in message.tool_calls]


def test_no_call_is_all_content():
    message = parse_tool_calls("Just text, <tool no call.\n")
    assert message.content == "Just text, <tool no call.\n"
    assert message.tool_calls == []


def test_one_call_with_content_before_it():
    message = parse_tool_calls("Let me check. " + WEATHER)
    assert message.content == "Let me check."
    assert named(message) == [("get_weather", {"city": "Paris", "days": 2})]
    call = message.tool_calls[0].to_dict()
    assert call["type"] == "function" and call["id"].startswith("call_")


def test_several_calls_and_no_content():
    message = parse_tool_calls(WEATHER + "\n" + TIME + "\n")
    assert message.content is None
    assert named(message) == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_time", {"zone": "Europe/Paris"}),
    ]
    assert len({call.id for call in message.tool_calls}) == 2


def test_max_calls_keeps_the_first():
    assert named(parse_tool_calls(WEATHER + TIME, max_calls=1)) == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>',
        '<tool_call>\n["name"]\n</tool_call>',
    ],
)
def test_a_malformed_call_stays_content(bad):
    message = parse_tool_calls("Hi " + bad + " " + TIME)
    assert message.content == "Hi " + bad
    assert named(message) == [("get_time", {"zone": "Europe/Paris"})]


def test_an_unclosed_call_parses_if_its_json_does():
    assert named(parse_tool_calls(WEATHER[: -len("</tool_call>")])) == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]
    cut = WEATHER[:30]
    message = parse_tool_calls(cut)
    assert message.content == cut and message.tool_calls == []


def test_parameters_is_taken_for_arguments():
    text = '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
    assert named(parse_tool_calls(text)) == [("f", {"x": 1})]


def test_stream_deltas_come_in_openai_order():
    stream = HermesStream()
    deltas = []
    for piece in [
        "Sure",
        ". <tool",
        '_call>\n{"name": "get_time", ',
        '"arguments": {}}\n</tool_call>',
    ]:
        deltas += stream.feed(piece)
    deltas += stream.finish()
    assert deltas[0] == {"content": "Sure"}
    assert deltas[1] == {"content": "."}
    header = deltas[2]["tool_calls"][0]
    assert header["index"] == 0 and header["type"] == "function"
    assert header["function"] == {"name": "get_time", "arguments": ""}
    assert deltas[3] == {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}
    assert len(deltas) == 4


def _without_ids(message):
    return message.content, named(message)


TEXTS = [
    "plain text with < and <tool and spaces  \n",
    "Before " + WEATHER + "\n\n" + TIME + " after",
    "x <tool_call>{bad}</tool_call>" + WEATHER,
    WEATHER[:-5],
    "  " + WEATHER + "  ",
]


@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(TEXTS), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_any_chunking_reassembles_to_the_whole_parse(text, cuts):
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    stream = HermesStream()
    deltas = []
    for start, end in itertools.pairwise(bounds):
        deltas += stream.feed(text[start:end])
    deltas += stream.finish()
    assert _without_ids(merge_deltas(deltas)) == _without_ids(parse_tool_calls(text))


def test_character_by_character_equals_the_whole_parse():
    text = TEXTS[1]
    stream = HermesStream()
    deltas = [delta for char in text for delta in stream.feed(char)] + stream.finish()
    streamed = merge_deltas(deltas)
    assert streamed.content == "Before after"
    assert _without_ids(streamed) == _without_ids(parse_tool_calls(text))
    assert len(streamed.tool_calls) == 2
