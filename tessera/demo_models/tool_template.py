"""The demo chat templates' function calling, hermes-style as Qwen2.5's chat template
does it, so that a demo checkpoint and a real Qwen one are prompted and parsed
(gateway/tool_calls.py) alike: the tools are listed in the system turn inside
<tools></tools>, a call is <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, and
a tool's answer comes back in a user turn inside <tool_response></tool_response>.

Without tools in the request and tool turns in the conversation, each template renders
exactly what it did without these parts."""

from __future__ import annotations

# Pieces hold no literal whitespace outside their expressions and trim none, so they
# fit templates that trim ({% %}, the LLaVA demo) and templates that do not (Qwen's).
# The tools, one JSON object a line, inside a system turn.
TOOLS_SYSTEM_JINJA = (
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call>\' }}'
)
# An assistant turn's calls, after its content (if any); arguments may be a dict or text.
TOOL_CALLS_JINJA = (
    "{% for call in (message['tool_calls'] or []) %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first or message['content'] %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' }}"
    "{% if function['arguments'] is string %}{{ function['arguments'] }}"
    "{% else %}{{ function['arguments'] | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
)
TOOL_RESPONSE_OPEN = "<tool_response>\\n"
TOOL_RESPONSE_CLOSE = "\\n</tool_response>"

_TEXT_MACRO = (
    "{% macro text_of(content) %}{% if content is string %}{{ content }}{% else %}"
    "{% for part in content %}{% if 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{% endmacro %}"
)


def qwen_template(sets: str, default_system: str, message: str, end: str, system: str) -> str:
    """A Qwen-VL demo template (`sets` + for-loop + `default_system` + `message` + `end`,
    `system` the default system text or "" for none) with Qwen2.5's tool parts: the tools
    in the system turn, an assistant turn's calls, tool turns as <tool_response>s in one
    user turn."""
    head = system + "\n\n" if system else ""
    own_system = "{{ text_of(messages[0]['content']) }}\n\n"
    tools_turn = (
        "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}"
        + own_system
        + "{% else %}"
        + head
        + "{% endif %}"
        + TOOLS_SYSTEM_JINJA
        + "<|im_end|>\n{% endif %}"
    )
    tool_turn = (
        "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user"
        # An expression, not text: the newline after a block tag is trimmed (trim_blocks).
        "{% endif %}{{ '\\n<tool_response>\\n' + text_of(message['content']) }}"
        "{{ '\\n</tool_response>' }}"
        "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>\n"
        "{% endif %}"
    )
    calls_turn = (
        "<|im_start|>assistant\n{% if message['content'] %}{{ text_of(message['content']) }}"
        "{% endif %}" + TOOL_CALLS_JINJA + "<|im_end|>\n"
    )
    return (
        _TEXT_MACRO
        + sets
        + tools_turn
        + "{% for message in messages %}"
        + "{% if tools and loop.first and message['role'] == 'system' %}"
        + "{% elif message['role'] == 'tool' %}"
        + tool_turn
        + "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
        + calls_turn
        + "{% else %}"
        + default_system.replace("{% if loop.first", "{% if not tools and loop.first")
        + message
        + "{% endif %}{% endfor %}"
        + end
    )
