"""tools / tool_choice / parallel_tool_calls through the real `openai` client on the
demo stack: forced calls (structured decoding) come back as parsed tool_calls whose
arguments validate against the function's schema, in streams as in whole answers."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tessera.testbed.cluster import http_gateway, scrape_metrics

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_PARAMETERS = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast of a city.",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME_PARAMETERS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def api(cluster, demo_model_dir):
    """A gateway with the HTTP API and auto tool choice, in front of the session's
    encoder and decoder."""
    with http_gateway(
        cluster,
        demo_model_dir,
        "--enable-auto-tool-choice",
    ) as own:
        yield own


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=api.http + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_calls(calls, allowed: set[str]) -> None:
    assert calls, "no tool calls were parsed"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize(
    ("tool_choice", "allowed"),
    [
        ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
        ("required", {"get_weather", "get_time"}),
    ],
)
def test_forced_choice_returns_calls_that_validate(api, client, tool_choice, allowed):
    before = tool_call_finishes(api)
    response = client.chat.completions.create(
        model="",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=120,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls, allowed)
    assert tool_call_finishes(api) == before + 1  # the metric says so too


def tool_call_finishes(api) -> float:
    """The gateway's requests that finished with tool calls, whatever the model's name."""
    return sum(
        value
        for key, value in scrape_metrics(api.http + "/metrics").items()
        if key.startswith("tessera_gateway_request_success_total{")
        and "finished_reason=tool_calls" in key
    )


def test_streamed_call_deltas_reassemble_to_the_whole_answer(client):
    options = {
        "model": "",
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "max_tokens": 120,
    }
    whole = client.chat.completions.create(**options).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish_reasons = []
    for chunk in client.chat.completions.create(stream=True, **options):
        choice = chunk.choices[0]
        finish_reasons.append(choice.finish_reason)
        assert not choice.delta.content
        for piece in choice.delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            if piece.id:
                assert call["id"] is None, "a call's id comes once, in its first delta"
                call["id"] = piece.id
                assert piece.function.name, "the name comes with the id"
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
    assert [r for r in finish_reasons if r] == ["tool_calls"]
    assert list(calls) == [0]
    assert calls[0]["name"] == whole[0].function.name == "get_weather"
    # Greedy: the same call both ways (ids are fresh per response).
    assert json.loads(calls[0]["arguments"]) == json.loads(whole[0].function.arguments)
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_PARAMETERS)


def test_a_tool_result_conversation_renders_and_answers(client):
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'},
    }
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    ]
    response = client.chat.completions.create(
        model="", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None
    # The tools, the call and its result all reached the prompt (the template lists them).
    without = client.chat.completions.create(model="", messages=MESSAGES, max_tokens=1)
    assert response.usage.prompt_tokens > without.usage.prompt_tokens + 100


def test_auto_answers_with_content_or_calls(client):
    response = client.chat.completions.create(
        model="", messages=MESSAGES, tools=TOOLS, max_tokens=16
    )
    choice = response.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
    else:
        assert choice.finish_reason in ("stop", "length")


BAD = {
    "not a list": ({"tools": {"type": "function"}}, "tools"),
    "bad name": (
        {"tools": [TOOLS[0], {"type": "function", "function": {"name": "no spaces"}}]},
        "tools[1].function.name",
    ),
    "not a function": ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    "parameters not a schema": (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
        "tools[0].function.parameters",
    ),
    "unknown key": (
        {"tools": [{"type": "function", "function": {"name": "f", "returns": {}}}]},
        "tools[0].function",
    ),
    "duplicate name": ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[0].function.name"),
    "unknown choice": ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    "named not offered": (
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice.function.name",
    ),
    "choice without tools": ({"tool_choice": "required"}, "tool_choice"),
    "parallel not bool": ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    "forced with response_format": (
        {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
    ),
    "tool message without id": (
        {"messages": [*MESSAGES, {"role": "tool", "content": "x"}]},
        "messages[1].tool_call_id",
    ),
    "call arguments not JSON": (
        {
            "messages": [
                *MESSAGES,
                {
                    "role": "assistant",
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{x"}}],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
    ),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_bad_tools_are_400_naming_the_field(client, case):
    fields, param = case
    body = {"model": "", "messages": MESSAGES, "max_tokens": 1, **fields}
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(**body)
    assert error.value.body["param"] == param
    # One request's failure never fails the next.
    assert client.chat.completions.create(model="", messages=MESSAGES, max_tokens=1).choices
