"""`trajlake model init DIR`: the demo's tiny Hugging Face chat model, built locally with no network.

The directory holds a Qwen2-architecture causal LM (random init, seeded, float32 safetensors),
a byte-level BPE tokenizer trained here with `tokenizers`, a ChatML chat template with tools,
and the `<tool_call>` / `<tool_response>` tokens vLLM's `hermes` tool parser looks for. vLLM
serves it on CPU and transformers trains it, so the tokens of a run come from a real engine.

The tokenizer is trained with exactly the normalizer and pre-tokenizer that transformers'
`Qwen2Tokenizer` rebuilds when it loads a `qwen2` tokenizer (NFC, the Qwen split regex, then
ByteLevel without its own regex), and is saved through `Qwen2Tokenizer` itself; `init_model`
then checks that `AutoTokenizer` and `tokenizers.Tokenizer` encode a probe set identically,
because a disagreement would make vLLM and the trainer see different ids for the same text.

The merges are learned from the chat markup, the demo's task language, example tool calls and
what the harness writes (its prompts, nudge and error messages), so a call takes ~22 tokens.
Each demo tool's argument-free call is one added token (`action_tokens`): the `answer` call a
model writes is one token, and the same call spelled out in ordinary tokens decodes to text that
re-encodes as that one token, the sharpest case of encode(decode(ids)) != ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from trajlake.common.settings import Settings, cli
from trajlake.rollout.engine.chatml import (
    CHAT_TEMPLATE,
    END_TOOL_RESPONSE,
    ENDOFTEXT,
    IM_END,
    IM_START,
    MARKUP_TOKENS,
    SPECIAL_TOKENS,
    TOOL_RESPONSE,
    tool_call_text,
)
from trajlake.schemas.errors import TrajlakeError

DEMO_TOOLS = ("calc", "python", "answer")


def action_tokens(tools: Iterable[str]) -> tuple[str, ...]:
    """The added tokens that spell an argument-free call of each tool in one token."""
    return tuple(tool_call_text(name) for name in tools)


class ModelInitConfig(Settings):
    """Shape of the tiny model and its tokenizer (env TRAJLAKE_MODEL_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_MODEL_")

    vocab_size: int = Field(
        512, ge=300, le=65536, description="Tokenizer vocabulary (256 bytes + merges + added tokens)."
    )
    hidden_size: int = Field(
        128,
        ge=32,
        validation_alias="TRAJLAKE_MODEL_WIDTH",
        description="Model width.",
        json_schema_extra=cli("--width"),
    )
    num_layers: int = Field(
        2,
        ge=1,
        le=64,
        validation_alias="TRAJLAKE_MODEL_LAYERS",
        description="Transformer layers.",
        json_schema_extra=cli("--layers"),
    )
    num_heads: int = Field(
        4,
        ge=1,
        validation_alias="TRAJLAKE_MODEL_HEADS",
        description="Attention heads; width / heads >= 32 (vLLM CPU).",
        json_schema_extra=cli("--heads"),
    )
    num_kv_heads: int = Field(
        2, ge=1, validation_alias="TRAJLAKE_MODEL_KV_HEADS", description="Key/value heads (grouped-query attention).",
        json_schema_extra=cli("--kv-heads"),
    )  # fmt: skip
    intermediate_size: int | None = Field(None, ge=1, description="MLP width; default 3 x hidden_size.")
    max_position_embeddings: int = Field(4096, ge=128, description="Longest context.")
    seed: int = Field(0, description="Seed of the random weights.")
    tools: tuple[str, ...] = Field(
        DEMO_TOOLS, description="Tools whose argument-free call gets its own token (the demo's)."
    )

    @model_validator(mode="after")
    def _shape(self) -> ModelInitConfig:
        problems = []
        if self.hidden_size % self.num_heads:
            problems.append(
                f"hidden_size {self.hidden_size} must be a multiple of num_heads {self.num_heads}"
            )
        elif self.hidden_size // self.num_heads < 32:
            problems.append(
                f"head size hidden_size / num_heads = {self.hidden_size // self.num_heads} is below 32, "
                "which vLLM's CPU attention does not support; raise --width or lower --heads"
            )
        if self.num_heads % self.num_kv_heads:
            problems.append(
                f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ModelInitError(TrajlakeError, RuntimeError):
    """The model directory could not be built or does not load consistently."""


def corpus(tools: Iterable[str]) -> list[str]:
    """Text the BPE merges are learned from: the chat markup and the demo's task language."""
    from trajlake.demo.envs import chat_episode, vocab

    words = [*vocab.WORDS, *vocab.DIGITS, *vocab.OPERATORS, *vocab.LETTERS]
    lines = [
        "You are a helpful assistant.",
        "You may call one or more functions to assist with the user query.",
        "For each function call, return a json object with function name and arguments within",
        '{"type": "function", "function": {"name": "calc", "description": "Evaluate", "parameters": {}}}',
        *chat_episode.harness_texts(),
        f"{IM_START}system\n{IM_END}\n{IM_START}user\n{IM_END}\n{IM_START}assistant\n{IM_END}\n",
        "the quick brown fox jumps over the lazy dog; The Quick Brown Fox 0123456789",
        *(tool_call_text(name, {"expression": "3 + 4"}) for name in tools),
        tool_call_text("python", {"code": "reverse a b c"}),
        tool_call_text("python", {"code": "count a in a b c"}),
        *(f"{TOOL_RESPONSE}\n{w} {w}\n{END_TOOL_RESPONSE}" for w in words),
    ]
    for a in vocab.DIGITS:
        for op in vocab.OPERATORS:
            lines.append(f"calc {a} {op} {a}")
    lines += [f"reverse {' '.join(vocab.LETTERS[: n + 2])}" for n in range(4)]
    lines += [f"count {x} in {' '.join(vocab.LETTERS)}" for x in vocab.LETTERS]
    return lines * 4


def train_tokenizer(config: ModelInitConfig):  # -> transformers.PreTrainedTokenizerBase
    """A byte-level BPE trained on `corpus`, wrapped and configured as transformers' Qwen2Tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    actions = action_tokens(config.tools)
    n_added = len(SPECIAL_TOKENS) + len(MARKUP_TOKENS) + len(actions)
    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size - n_added,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        special_tokens=[ENDOFTEXT],
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(config.tools), trainer=trainer)
    state = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=state["vocab"], merges=merges)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [IM_START, IM_END]}, replace_extra_special_tokens=False
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*MARKUP_TOKENS, *actions)])
    tokenizer.eos_token = IM_END
    tokenizer.pad_token = ENDOFTEXT
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = config.max_position_embeddings
    return tokenizer


def build_model(config: ModelInitConfig, vocab_size: int, eos_id: int, pad_id: int):  # -> Qwen2ForCausalLM
    """A Qwen2ForCausalLM with seeded random weights, in float32."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hf_config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size or 3 * config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=False,  # vLLM reloads a tied head from the old tensors: weight updates need it untied
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        use_sliding_window=False,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return Qwen2ForCausalLM(hf_config).to(torch.float32)


def probe_texts(tokenizer) -> list[str]:
    """Texts on which the two tokenizer loaders must agree: chat, tool calls, unicode, odd spacing."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "calc 7 * 8"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {}}}]},
        {"role": "tool", "content": "56"},
    ]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    chat = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return [
        chat,
        "Ünïcödé ﬁ café, 東京, emoji 🙂 and combining e\u0301",
        "  leading spaces\n\n\ttabs\r\nand CRLF   ",
        "don't, I'll, we've; it's 12345 + 678",
        tool_call_text("calc") + tool_call_text("python", {"code": "print('x'[::-1])"}),
    ]


def check_tokenizers_agree(model_dir: Path) -> None:
    """Raise `ModelInitError` unless AutoTokenizer and tokenizers.Tokenizer give the same ids."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(model_dir))
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in probe_texts(auto):
        a = auto.encode(text, add_special_tokens=False)
        b = raw.encode(text, add_special_tokens=False).ids
        if a != b:
            raise ModelInitError(
                f"AutoTokenizer and tokenizers.Tokenizer encode {text[:60]!r} differently "
                f"({a[:12]}… vs {b[:12]}…); vLLM and the trainer would disagree on token ids"
            )


def init_model(model_dir: str | Path, config: ModelInitConfig | None = None) -> dict:
    """Write the tiny model, tokenizer and chat template to `model_dir`; return a summary."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    config = config or ModelInitConfig()
    target = Path(model_dir)
    if target.exists() and any(target.iterdir()):
        raise ModelInitError(f"{target} exists and is not empty; pass an empty or new directory")
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(config)
    vocab_size = len(tokenizer)
    model = build_model(config, vocab_size, tokenizer.convert_tokens_to_ids(IM_END), tokenizer.pad_token_id)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(IM_END)
    model.save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))
    check_tokenizers_agree(target)
    n_params = sum(p.numel() for p in model.parameters())
    summary = {
        "model_dir": str(target.resolve()),
        "architecture": "Qwen2ForCausalLM",
        "parameters": n_params,
        "vocab_size": vocab_size,
        "hidden_size": config.hidden_size,
        "layers": config.num_layers,
        "heads": config.num_heads,
        "action_tokens": {t: tokenizer.convert_tokens_to_ids(t) for t in action_tokens(config.tools)},
    }
    (target / "trajlake-model.json").write_text(
        json.dumps({**summary, "config": config.model_dump()}, indent=2)
    )
    return summary
