"""The demo environment's token vocabulary: a few dozen ids, defined here, nothing downloaded.

The policy reads and writes these ids directly (token-in, token-out), so no tokenizer ever
re-encodes text. Words exist only so that people can read trajectories in SQL results.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SPECIAL_TOKENS = (
    "<pad>",
    "<bos>",
    "<eos>",  # the model ends its turn without acting
    "<call:calc>",  # the model calls the calculator on the task's expression
    "<call:python>",  # the model runs the task's string operation in the code sandbox
    "<answer>",  # the model submits the last tool result as its final answer
    "<result>",  # env: a tool result follows
    "</result>",
    "<error>",  # env: the tool refused the call
    "<truncated>",  # env: the tool output was cut to the output budget
    "<nudge>",  # env: 80% of the context budget is used; answer now
)
WORDS = ("calc", "reverse", "count", "in")
DIGITS = tuple(str(d) for d in range(10))
OPERATORS = ("+", "-", "*")
LETTERS = ("a", "b", "c", "d", "e")

TOKENS: tuple[str, ...] = SPECIAL_TOKENS + WORDS + DIGITS + OPERATORS + LETTERS
"""Every token, its position is its id."""

TOKEN_ID: dict[str, int] = {tok: i for i, tok in enumerate(TOKENS)}
VOCAB_SIZE = len(TOKENS)

PAD, BOS, EOS = TOKEN_ID["<pad>"], TOKEN_ID["<bos>"], TOKEN_ID["<eos>"]
CALL_CALC, CALL_PYTHON, ANSWER = TOKEN_ID["<call:calc>"], TOKEN_ID["<call:python>"], TOKEN_ID["<answer>"]
RESULT, END_RESULT, ERROR = TOKEN_ID["<result>"], TOKEN_ID["</result>"], TOKEN_ID["<error>"]
TRUNCATED, NUDGE = TOKEN_ID["<truncated>"], TOKEN_ID["<nudge>"]

STOP_IDS = (EOS, CALL_CALC, CALL_PYTHON, ANSWER)
"""Tokens that end a model turn: an action, or giving the turn back."""

TOOL_OF_CALL = {CALL_CALC: "calc", CALL_PYTHON: "python"}


def encode(words: Iterable[str]) -> list[int]:
    """Ids of space-separated tokens; an unknown token raises `KeyError` naming it."""
    out = []
    for word in words:
        if word not in TOKEN_ID:
            raise KeyError(f"{word!r} is not in the demo vocabulary; known tokens: {' '.join(TOKENS)}")
        out.append(TOKEN_ID[word])
    return out


def decode(ids: Sequence[int]) -> str:
    """Readable text of ids (for logs and examples; the lake stores ids)."""
    return " ".join(TOKENS[i] if 0 <= i < VOCAB_SIZE else f"<{i}?>" for i in ids)
