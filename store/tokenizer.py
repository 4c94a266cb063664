"""The tokenizer of a run: found from the model it recorded (or an override), it turns token ids into text.

`trajectory_started` records the model a trajectory was sampled from; the demo's vLLM engine
names its local model directory, whose tokenizer decodes the tokens exactly. `find_decoder`
loads that model's tokenizer, or the one the user names with `--tokenizer DIR`, and never
downloads: a model or tokenizer directory, a `tokenizer.json` file, or a model name already in
the Hugging Face cache. The browser, `trajlake export` and SQL's `detokenize()` all use it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.common.threads import importing, once_per_key
from trajlake.store.errors import LakeError

PIECE_CONTEXT = 4
"""Tokens decoded before each token to find its own text: a leading space or the rest of a
multi-byte character depends on its neighbours."""

TOOL_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.S)
"""A tool's output inside a user message (the hermes format of ChatML templates)."""


class TokenizerNotFound(LakeError):
    """No tokenizer loads for a run's recorded model or the given path; the message says the fix."""

    def __init__(self, message: str, *, model: str | None = None) -> None:
        super().__init__(message)
        self.model = model


@dataclass(frozen=True)
class ChatMarkup:
    """How a chat template wraps each message: `open` + role + `close`, the content, then `end`."""

    open: str
    close: str
    end: str

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkup | None:
        """The markup the tokenizer's chat template renders, or None (no template, or one not read here).

        A stand-in chat user → assistant → user is rendered; between two contents lie the end of
        one message and the header of the next, and the header starts at a special token."""
        if not getattr(tokenizer, "chat_template", None):
            return None
        marks = ["TRAJLAKEMARKA", "TRAJLAKEMARKB", "TRAJLAKEMARKC"]
        roles = ["user", "assistant", "user"]
        try:
            text = tokenizer.apply_chat_template(
                [{"role": r, "content": m} for r, m in zip(roles, marks, strict=True)], tokenize=False
            )
        except Exception:  # a template that rejects the stand-in chat is just not parsed
            return None
        if not isinstance(text, str) or not all(m in text for m in marks):
            return None
        gaps = [text[text.index(a) + len(a) : text.index(b)] for a, b in itertools.pairwise(marks)]
        close = _common_suffix(gaps)
        heads = [gap[: len(gap) - len(close)] for gap in gaps]
        if not heads[0].endswith("assistant") or not heads[1].endswith("user"):
            return None
        head = heads[1].removesuffix("user")
        if head != heads[0].removesuffix("assistant"):
            return None
        specials = [t for t in tokenizer.get_added_vocab() if t and t in head]
        if not specials:
            return None
        start = max(head.rfind(t) for t in specials)
        return cls(open=head[start:], close=close, end=head[:start])

    def split(self, text: str) -> list[dict[str, str]]:
        """The messages in `text`: one per header, the end markup removed; tool outputs as `tool`.

        An empty assistant message (the generation prompt) opens the next output's message and is
        skipped, as is what precedes the first header (the end of the previous message)."""
        pattern = re.escape(self.open) + r"(\w+)" + re.escape(self.close)
        parts = re.split(pattern, text)
        messages = []
        for role, content in zip(parts[1::2], parts[2::2], strict=True):
            content = self.strip_end(content)
            if (
                role == "user"
                and TOOL_RESPONSE.search(content)
                and not TOOL_RESPONSE.sub("", content).strip()
            ):
                messages += [{"role": "tool", "content": m} for m in TOOL_RESPONSE.findall(content)]
            elif content or role != "assistant":
                messages.append({"role": role, "content": content})
        return messages

    def strip_end(self, content: str) -> str:
        """`content` without the end markup the template puts after a message."""
        for end in (self.end, self.end.rstrip()):
            if end and content.endswith(end):
                return content[: -len(end)]
        return content


def _common_suffix(texts: Sequence[str]) -> str:
    n = 0
    while all(len(t) > n for t in texts) and len({t[len(t) - 1 - n] for t in texts}) == 1:
        n += 1
    return texts[0][len(texts[0]) - n :] if n else ""


class Decoder:
    """The token ids of one tokenizer as text: the whole text, each token's own text, chat messages."""

    def __init__(self, tokenizer: Any, source: str) -> None:
        self.tokenizer = tokenizer
        self.source = source
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer: ~3x quicker
        self.markup = ChatMarkup.from_tokenizer(tokenizer)
        self.eos = getattr(tokenizer, "eos_token", None)

    def __call__(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens included."""
        if self._backend is not None:
            return str(self._backend.decode(list(ids), skip_special_tokens=False))
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def batch(self, sequences: Sequence[Sequence[int]]) -> list[str]:
        """The text of each id list, special tokens included; a fast tokenizer decodes them in one call,
        on several threads."""
        if self._backend is not None:
            return list(self._backend.decode_batch([list(s) for s in sequences], skip_special_tokens=False))
        return [self(s) for s in sequences]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text, in order; joined they are the text of `ids`.

        A character split over several tokens is given to the token that completes it (the
        earlier ones get ''), so no piece shows a replacement character that the text lacks."""
        ids = list(ids)
        pieces: list[str] = []
        done = 0  # tokens whose text is given out
        for i in range(len(ids)):
            start = max(0, done - PIECE_CONTEXT)
            text = self(ids[start : i + 1])
            if text.endswith("\ufffd") and i + 1 < len(ids):
                pieces.append("")  # an unfinished character: its text goes to the token that ends it
                continue
            before = self(ids[start:done])
            pieces.append(text[len(before) :] if text.startswith(before) else self(ids[done : i + 1]))
            done = i + 1
        return pieces

    def messages(self, ids: Sequence[int], role: str) -> list[dict[str, str]]:
        """The chat messages in `ids` (a prompt, or input the environment appended), as role/content
        pairs without template markup; `role` for the whole text when no markup is found."""
        text = self(ids)
        if self.markup is not None and self.markup.open in text:
            return self.markup.split(text)
        return [{"role": role, "content": text}]

    def reply(self, ids: Sequence[int]) -> str:
        """What the model wrote, without the markup that ends its message."""
        text = self(ids)
        if self.markup is not None:
            text = self.markup.strip_end(text)
        if self.eos and text.endswith(self.eos):
            text = text[: -len(self.eos)]
        return text


@once_per_key(maxsize=16)
def load_decoder(path: str) -> Decoder:
    """The decoder of a local model/tokenizer directory, a tokenizer.json file, or a cached model name.

    Never downloads. Raises `TokenizerNotFound` (its message says why) when none loads. Loaded
    once per path however many threads ask (DuckDB runs `detokenize()` on several), and under
    the import lock: transformers imports the tokenizer's classes on first use."""
    if not path:
        raise TokenizerNotFound("no model recorded")
    with importing():  # huggingface_hub imports lazily too
        # decided before transformers (and torch) load: seconds
        if not (Path(path).exists() or _in_hf_cache(path)):
            raise TokenizerNotFound(
                f"{path} is neither a directory here nor a model in the Hugging Face cache"
            )
        return Decoder(_load_tokenizer(path), path)


def _load_tokenizer(path: str) -> Any:
    """The transformers tokenizer of `path` (a tokenizer.json file, or a directory or cached model name)."""
    try:
        import transformers
    except ImportError:
        raise TokenizerNotFound(
            "decoding tokens needs transformers; pip install 'trajlake[tokenizers]'"
        ) from None
    if Path(path).is_file():
        try:
            return transformers.PreTrainedTokenizerFast(tokenizer_file=path)
        except Exception as err:  # tokenizers raises its own untyped errors on a bad file
            raise TokenizerNotFound(f"{path} is not a tokenizer.json ({_first_line(err)})") from None
    try:
        return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        if Path(path).is_dir():
            raise TokenizerNotFound(f"{path} holds no tokenizer ({_first_line(err)})") from None
        raise TokenizerNotFound(
            f"{path} is neither a directory here nor a model in the Hugging Face cache"
        ) from None


def _in_hf_cache(name: str) -> bool:
    """True if the Hugging Face cache holds a tokenizer of model `name`."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # comes with transformers: without it nothing is cached
        return False
    try:
        return any(
            isinstance(try_to_load_from_cache(name, file), str)
            for file in ("tokenizer.json", "tokenizer_config.json")
        )
    except ValueError:  # not a repository id
        return False


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def find_decoder(model: str | None, override: str | None = None) -> Decoder:
    """The decoder for a run that recorded `model`, or for `override` (the user's `--tokenizer`).

    Raises `TokenizerNotFound` naming the fix when neither loads."""
    if override:
        try:
            return load_decoder(override)
        except TokenizerNotFound as err:
            raise TokenizerNotFound(
                f"--tokenizer {override} does not load: {err}; pass a local model or tokenizer directory",
                model=model,
            ) from None
    if not model:
        raise TokenizerNotFound(
            "the run recorded no model, so its tokenizer is unknown; pass --tokenizer DIR "
            "(a local model or tokenizer directory)"
        )
    try:
        return load_decoder(model)
    except TokenizerNotFound as err:
        raise TokenizerNotFound(
            f"no tokenizer for the run's model {model!r} on this machine ({err}); "
            "pass --tokenizer DIR (a local model or tokenizer directory)",
            model=model,
        ) from None
