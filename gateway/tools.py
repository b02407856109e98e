"""Function calling on the chat API, request side: `tools`, `tool_choice` and
`parallel_tool_calls` checked into a `ToolRequest`, and the grammar that forces a call
when tool_choice is "required" or names a function.

As vLLM does: tool_choice "none" still renders the tools in the prompt but never parses
calls out of the output; "auto" needs the server's --enable-auto-tool-choice and leaves
the output free (calls are parsed from it, gateway/tool_calls.py); "required" and a named
function force hermes-style call text through structured decoding (a Lark grammar the
decoder applies as a token mask).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.front import Rejected
from tessera.limits import MAX_GRAMMAR_CHARS
from tessera.v1 import common_pb2

MAX_TOOLS = 128
MAX_DESCRIPTION_CHARS = 4096
# OpenAI's rule for a function's name.
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
TOOL_CHOICES = ("none", "auto", "required")
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
# A function without parameters takes an object (OpenAI's reading of a missing schema).
_ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolFunction:
    name: str
    description: str
    parameters: dict

    def template_dict(self) -> dict:
        """The OpenAI shape that HF chat templates take for `tools=`."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[ToolFunction, ...]
    choice: str  # "none", "auto", "required" or "function" (named)
    named: str = ""  # the function tool_choice names
    parallel: bool = True

    @property
    def parses_calls(self) -> bool:
        return self.choice != "none"

    def template_tools(self) -> list[dict]:
        return [tool.template_dict() for tool in self.tools]


@dataclass(frozen=True)
class ToolSettings:
    """The server's: --tool-call-parser and --enable-auto-tool-choice."""

    parser: str = "hermes"
    enable_auto_tool_choice: bool = False


DEFAULT_TOOL_SETTINGS = ToolSettings()


def _require(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise Rejected(message, param=param)


def tools_from_body(body: dict, settings: ToolSettings) -> ToolRequest | None:
    """The request's tools, or None when it has none (a tool_choice without tools, other
    than "none", is refused: nothing could be called)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    _require(
        parallel is None or isinstance(parallel, bool),
        "parallel_tool_calls must be true or false",
        "parallel_tool_calls",
    )
    if tools is None:
        _require(
            choice in (None, "none"),
            "tool_choice needs tools; send tools or leave tool_choice out",
            "tool_choice",
        )
        return None
    _require(
        isinstance(tools, list) and 0 < len(tools) <= MAX_TOOLS,
        f"tools must be a list of 1 to {MAX_TOOLS} tools",
        "tools",
    )
    functions = tuple(_tool(f"tools[{i}]", tool) for i, tool in enumerate(tools))
    names = [f.name for f in functions]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    _require(
        duplicate is None,
        f"tools name {duplicate!r} twice",
        f"tools[{names.index(duplicate) if duplicate else 0}].function.name",
    )
    kind, named = _choice(choice, names)
    if kind != "none":
        _require(
            settings.parser != "none",
            'this server parses no tool calls (--tool-call-parser none); use tool_choice "none"',
            "tool_choice",
        )
    if kind == "auto":
        _require(
            settings.enable_auto_tool_choice,
            'tool_choice "auto" needs the server to run with --enable-auto-tool-choice',
            "tool_choice",
        )
    return ToolRequest(functions, kind, named, parallel is not False)


def _tool(param: str, tool: Any) -> ToolFunction:
    _require(isinstance(tool, dict), f"{param} must be an object", param)
    _require(tool.get("type") == "function", f'{param}.type must be "function"', f"{param}.type")
    unknown = sorted(set(tool) - {"type", "function"})
    _require(not unknown, f"{param} takes type and function, not {unknown}", param)
    function = tool.get("function")
    param = f"{param}.function"
    _require(isinstance(function, dict), f"{param} must be an object", param)
    unknown = sorted(set(function) - _FUNCTION_KEYS)
    _require(not unknown, f"{param} takes {sorted(_FUNCTION_KEYS)}, not {unknown}", param)
    name = function.get("name")
    _require(
        isinstance(name, str) and NAME_PATTERN.match(name) is not None,
        f"{param}.name must be 1 to 64 letters, digits, '_' or '-'",
        f"{param}.name",
    )
    description = function.get("description") or ""
    _require(
        isinstance(description, str) and len(description) <= MAX_DESCRIPTION_CHARS,
        f"{param}.description must be a string of at most {MAX_DESCRIPTION_CHARS} characters",
        f"{param}.description",
    )
    strict = function.get("strict")
    _require(
        strict is None or isinstance(strict, bool),
        f"{param}.strict must be true or false",
        f"{param}.strict",
    )
    parameters = function.get("parameters")
    parameters = _ANY_OBJECT if parameters is None else parameters
    _require(
        isinstance(parameters, dict),
        f"{param}.parameters must be a JSON Schema object",
        f"{param}.parameters",
    )
    _require(
        len(json.dumps(parameters)) <= MAX_GRAMMAR_CHARS,
        f"{param}.parameters is over {MAX_GRAMMAR_CHARS} characters as JSON",
        f"{param}.parameters",
    )
    return ToolFunction(name, description, parameters)


def _choice(choice: Any, names: list[str]) -> tuple[str, str]:
    if choice is None:
        return "auto", ""  # OpenAI's default when tools are given
    if isinstance(choice, str):
        _require(
            choice in TOOL_CHOICES,
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
        return choice, ""
    _require(
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict),
        'tool_choice must be {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )
    name = choice["function"].get("name")
    _require(
        name in names,
        f"tool_choice.function.name {name!r} is not one of the tools",
        "tool_choice.function.name",
    )
    return "function", name


# llguidance's JSON options: the arguments written as json.dumps writes them (and as the
# template shows calls), with no free whitespace for a model to loop in.
_COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _compact(schema: dict) -> dict:
    return {**schema, "x-guidance": _COMPACT_JSON}


def forced_call_grammar(request: ToolRequest) -> common_pb2.StructuredOutput | None:
    """The Lark grammar whose language is exactly hermes call text for the functions the
    request allows (None when the output stays free): one call, or with
    parallel_tool_calls one or more separated by newlines."""
    if request.choice not in ("required", "function"):
        return None
    allowed = [t for t in request.tools if request.choice == "required" or t.name == request.named]
    rules = [
        f'call_{i}: "<tool_call>\\n{{\\"name\\": \\"{tool.name}\\", \\"arguments\\": " '
        f'args_{i} "}}\\n</tool_call>"\n'
        f"args_{i}: %json {json.dumps(_compact(tool.parameters))}\n"
        for i, tool in enumerate(allowed)
    ]
    call = " | ".join(f"call_{i}" for i in range(len(allowed)))
    start = 'start: call ("\\n" call)*\n' if request.parallel else "start: call\n"
    grammar = start + f"call: {call}\n" + "".join(rules)
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise Rejected(
            f"the tools' parameters add up to over {MAX_GRAMMAR_CHARS} characters of grammar",
            param="tools",
        )
    return common_pb2.StructuredOutput(lark=grammar)


MAX_HISTORY_CALLS = 64


def history_fields(param: str, message: dict) -> dict:
    """`tool_calls` of an assistant turn and `tool_call_id` of a tool turn, in the shape
    chat templates take (a call's arguments as a dict, where OpenAI sends JSON text)."""
    role = message.get("role")
    calls = message.get("tool_calls")
    call_id = message.get("tool_call_id")
    fields: dict[str, Any] = {}
    if calls is not None:
        _require(role == "assistant", f"{param}.tool_calls is for assistant messages", param)
        _require(
            isinstance(calls, list) and len(calls) <= MAX_HISTORY_CALLS,
            f"{param}.tool_calls must be a list of at most {MAX_HISTORY_CALLS} calls",
            f"{param}.tool_calls",
        )
        fields["tool_calls"] = tuple(
            _history_call(f"{param}.tool_calls[{i}]", call) for i, call in enumerate(calls)
        )
    if role == "tool":
        _require(
            isinstance(call_id, str) and call_id,
            f"{param}.tool_call_id must name the call this message answers",
            f"{param}.tool_call_id",
        )
        fields["tool_call_id"] = call_id
    else:
        _require(call_id is None, f"{param}.tool_call_id is for tool messages", param)
    return fields


def _history_call(param: str, call: Any) -> dict:
    _require(isinstance(call, dict), f"{param} must be an object", param)
    _require(call.get("type", "function") == "function", f'{param}.type must be "function"', param)
    call_id = call.get("id", "")
    _require(isinstance(call_id, str), f"{param}.id must be a string", f"{param}.id")
    function = call.get("function")
    _require(isinstance(function, dict), f"{param}.function must be an object", param)
    name = function.get("name")
    _require(isinstance(name, str) and name, f"{param}.function.name must be a string", param)
    text = function.get("arguments", "{}")
    _require(
        isinstance(text, str),
        f"{param}.function.arguments must be JSON text",
        f"{param}.function.arguments",
    )
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    _require(
        isinstance(arguments, dict),
        f"{param}.function.arguments must be a JSON object",
        f"{param}.function.arguments",
    )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
