"""ChatML markup with hermes tool calls: the special tokens, the chat template (Qwen2.5's, with tools,
trimmed to what trajlake renders) and a tool call's exact text."""

from __future__ import annotations

import json

ENDOFTEXT = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"
TOOL_RESPONSE, END_TOOL_RESPONSE = "<tool_response>", "</tool_response>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
MARKUP_TOKENS = (TOOL_CALL, END_TOOL_CALL, TOOL_RESPONSE, END_TOOL_RESPONSE)


def tool_call_text(name: str, arguments: dict | None = None) -> str:
    """A hermes tool call exactly as the chat template renders it."""
    body = json.dumps({"name": name, "arguments": arguments or {}})
    return f"{TOOL_CALL}\n{body}\n{END_TOOL_CALL}"


# Qwen2.5's ChatML template with tools, trimmed to what trajlake renders.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}"
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% if message.content or not loop.first %}\n{% endif %}"
    "{% set fn = call.function if call.function is defined else call %}"
    '<tool_call>\n{"name": "{{ fn.name }}", "arguments": '
    "{% if fn.arguments is string %}{{ fn.arguments }}{% else %}{{ fn.arguments | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
).replace("%}\n", "%}{{ '\\n' }}")  # transformers renders with trim_blocks, which eats a newline after a tag
