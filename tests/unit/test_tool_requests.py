"""The request side of tools: validation against the server's settings, the forced-call
grammar (compiled by llguidance on the demo tokenizer), and tools plus tool history
rendered by the demo chat template into the prompt."""

from __future__ import annotations

import asyncio
import json

import llguidance
import llguidance.hf
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from gateway.front import Rejected
from gateway.media_fetch import MediaFetchPolicy
from gateway.openai_api import messages_from_body
from gateway.prompt import PromptBuilder
from gateway.tool_calls import parse_tool_calls
from gateway.tools import ToolSettings, forced_call_grammar, tools_from_body
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.demo_models.qwen_vl import QWEN2_CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE
from tessera.media_decoder import MediaLimits

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "get_time"}},
]
AUTO = ToolSettings(enable_auto_tool_choice=True)


@pytest.fixture(scope="module")
def family(demo_model_dir):
    return load_family(str(demo_model_dir), LoadOptions(ModelPart.PROCESSOR))


def test_choices_and_the_server_settings():
    assert tools_from_body({"tools": TOOLS}, AUTO).choice == "auto"
    with pytest.raises(Rejected, match="--enable-auto-tool-choice") as error:
        tools_from_body({"tools": TOOLS}, ToolSettings())
    assert error.value.param == "tool_choice"
    assert tools_from_body({"tools": TOOLS, "tool_choice": "required"}, ToolSettings())
    unparsed = ToolSettings(parser="none")
    with pytest.raises(Rejected, match="--tool-call-parser none"):
        tools_from_body({"tools": TOOLS, "tool_choice": "required"}, unparsed)
    none = tools_from_body({"tools": TOOLS, "tool_choice": "none"}, unparsed)
    assert not none.parses_calls and len(none.template_tools()) == 2
    assert tools_from_body({}, ToolSettings()) is None
    assert forced_call_grammar(tools_from_body({"tools": TOOLS}, AUTO)) is None


def _matcher(family, request) -> llguidance.LLMatcher:
    tokenizer = llguidance.hf.from_tokenizer(family.tokenizer)
    lark = forced_call_grammar(request).lark
    return llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(lark))


def _accepts(family, request, text: str) -> bool:
    matcher = _matcher(family, request)
    ids = family.tokenize(text)
    return matcher.consume_tokens(ids) and matcher.is_accepting()


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def test_a_named_choice_accepts_exactly_its_calls(family):
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = tools_from_body(
        {"tools": TOOLS, "tool_choice": named, "parallel_tool_calls": False}, ToolSettings()
    )
    good = call("get_weather", {"city": "Paris"})
    assert _accepts(family, request, good)
    assert parse_tool_calls(good).tool_calls[0].name == "get_weather"
    assert not _accepts(family, request, call("get_time", {}))
    assert not _accepts(family, request, call("get_weather", {"city": "Oslo"}))
    assert not _accepts(family, request, good + "\n" + good)


def test_required_accepts_any_tool_and_parallel_calls(family):
    request = tools_from_body({"tools": TOOLS, "tool_choice": "required"}, ToolSettings())
    two = call("get_time", {"any": 1}) + "\n" + call("get_weather", {"city": "Rome"})
    assert _accepts(family, request, two)
    assert not _accepts(family, request, "Sure! " + call("get_time", {}))


def test_tools_and_tool_history_reach_the_prompt(family):
    body = {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_7", "content": "Sunny."},
        ]
    }
    messages = asyncio.run(messages_from_body(body, MediaFetchPolicy((), (), 1.0, 1 << 20)))
    builder = PromptBuilder(family, MediaLimits(), limit_mm_per_prompt=1)
    request = tools_from_body({"tools": TOOLS, "tool_choice": "none"}, ToolSettings())
    prompt = builder.build(messages, tools=request.template_tools())
    text = family.decode_tokens(prompt.token_ids)
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in text
    assert call("get_weather", {"city": "Rome"}) in text
    assert "<tool_response>\nSunny.\n</tool_response>" in text


@pytest.mark.parametrize("template", [QWEN2_CHAT_TEMPLATE, QWEN3_CHAT_TEMPLATE])
def test_the_qwen_demo_templates_write_qwen25_tool_turns(template):
    """Qwen2.5's own template's output for the same conversation (its tools section,
    calls and grouped tool responses)."""
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_time", "arguments": {"zone": "UTC"}}}],
        },
        {"role": "tool", "content": "12:00"},
        {"role": "tool", "content": [{"type": "text", "text": "13:00"}]},
    ]
    text = render_jinja_template(
        [messages], tools=TOOLS[1:], chat_template=template, add_generation_prompt=True
    )[0][0]
    assert text.startswith("<|im_start|>system\n")
    assert '<tools>\n{"type": "function", "function": {"name": "get_time"}}\n</tools>' in text
    assert text.endswith(
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response>\n"
        "<tool_response>\n13:00\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
