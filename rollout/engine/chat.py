"""Chat-level token-in-token-out: a conversation whose token ids are never re-tokenised.

The classic way agent-RL data goes off-policy is to keep a list of chat messages and apply
the chat template to the whole conversation before every turn: the engine's sampled ids are
decoded to text and encoded again, and `encode(decode(ids)) != ids` for any tokenizer whose
model may emit a non-canonical segmentation. `ChatSession` instead renders the template once
for the opening messages, then grows the prompt only by

- each assistant output's ids exactly as the engine returned them, and
- the ids of new messages (tool results, user turns) rendered on their own: the template
  applied to a fixed stand-in conversation with and without them, the difference encoded.

So every turn's input extends the previous input + output, and the Recorder's prefix check
passes. Tool calls are parsed from the decoded output (`<tool_call>{json}</tool_call>`, the
hermes format; an unterminated last call is read too); one that does not parse is returned as
malformed, for the tool runner's retry budget and the failure taxonomy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajlake.rollout.engine.chatml import END_TOOL_CALL, IM_END, TOOL_CALL

TOOL_CALL_RE = re.compile(
    re.escape(TOOL_CALL) + r"(.*?)" + re.escape(END_TOOL_CALL) + "|" + re.escape(TOOL_CALL) + r"(.*)$", re.S
)
_STAND_IN = [
    {"role": "system", "content": "x"},
    {"role": "user", "content": "x"},
    {"role": "assistant", "content": "x"},
]


@dataclass
class ParsedCall:
    """One tool call read from generated text: `name` and `arguments`, or why it is malformed."""

    raw: str
    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def malformed(self) -> bool:
        """True when the call's JSON or its fields did not parse."""
        return self.error is not None

    def as_call(self) -> dict[str, Any]:
        """The call as the tool runner takes it (`{"name", "arguments"}`)."""
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class AssistantTurn:
    """What the model wrote in one turn: its ids, the decoded text, and the tool calls in it."""

    token_ids: list[int]
    text: str
    content: str
    tool_calls: list[ParsedCall]
    ended: bool  # the output closed its message with <|im_end|>


def parse_tool_calls(text: str) -> list[ParsedCall]:
    """Every hermes tool call in `text`; each malformed one says what is wrong with it."""
    calls = []
    for match in TOOL_CALL_RE.finditer(text):
        raw = (match.group(1) if match.group(1) is not None else match.group(2)).strip()
        try:
            body = json.loads(raw)
        except ValueError as err:
            calls.append(ParsedCall(raw, error=f"the call is not JSON ({err.msg} at {err.pos})"))
            continue
        if not isinstance(body, Mapping) or not isinstance(body.get("name"), str):
            calls.append(ParsedCall(raw, error='the call needs a string "name"'))
            continue
        arguments = body.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                calls.append(ParsedCall(raw, body["name"], error="arguments is a string that is not JSON"))
                continue
        if not isinstance(arguments, Mapping):
            calls.append(ParsedCall(raw, body["name"], error='"arguments" must be an object'))
            continue
        calls.append(ParsedCall(raw, body["name"], dict(arguments)))
    return calls


class ChatSession:
    """The token ids of one conversation, rendered once and then only appended to."""

    def __init__(
        self,
        tokenizer: Any,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
        self.ids: list[int] = self._encode_chat(list(messages), add_generation_prompt=True)
        self.pending: list[int] = list(self.ids)  # appended since the last model turn: the next turn's input
        self._open = False  # an assistant message is open (its output did not end with <|im_end|>)

    def _encode_chat(self, messages: list[Mapping[str, Any]], add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def prompt_ids(self) -> list[int]:
        """The ids to send for the next model turn."""
        return list(self.ids)

    def take_pending(self) -> list[int]:
        """The ids appended since the last model turn (the turn's `input_token_ids`), then forget them."""
        pending, self.pending = self.pending, []
        return pending

    def add_output(self, token_ids: Sequence[int]) -> AssistantTurn:
        """Append the model's output ids exactly as returned; parse its text and tool calls."""
        ids = [int(t) for t in token_ids]
        self.ids.extend(ids)
        ended = bool(ids) and ids[-1] == self.im_end_id
        self._open = not ended
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        content = TOOL_CALL_RE.sub("", text.removesuffix(IM_END)).strip()
        return AssistantTurn(ids, text, content, parse_tool_calls(text), ended)

    def add_messages(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Append the ids of `messages` rendered on their own (closing an open assistant message first)."""
        text = self.render_new(messages, add_generation_prompt)
        # close an open assistant message; the template's newline follows <|im_end|> either way
        text = (IM_END if self._open else "") + "\n" + text
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        self._open = False
        self.ids.extend(ids)
        self.pending.extend(ids)
        return ids

    def render_new(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` following an assistant message, without that message."""
        base = self.tokenizer.apply_chat_template(_STAND_IN, tools=self.tools, tokenize=False)
        full = self.tokenizer.apply_chat_template(
            [*_STAND_IN, *messages],
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )
        base = base.removesuffix("\n")  # the session writes the newline after <|im_end|> itself
        if not full.startswith(base):
            raise ValueError("the chat template renders earlier messages differently when more follow; "
                             "it cannot be rendered incrementally")  # fmt: skip
        return full[len(base) :].removeprefix("\n")


def naive_prompt_ids(
    tokenizer: Any, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> list[int]:
    """What a harness that re-applies the template to the whole conversation sends (drifts: for tests)."""
    text = tokenizer.apply_chat_template(
        list(messages), tools=tools, tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)
