"""`trajlake model init`: a tiny Qwen2 chat model whose two tokenizer loaders agree, built offline."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from trajlake.cli import main
from trajlake.demo.model import (
    DEMO_TOOLS,
    ModelInitConfig,
    ModelInitError,
    action_tokens,
    check_tokenizers_agree,
    init_model,
    probe_texts,
    tool_call_text,
)


def test_model_init_writes_a_qwen2_model_with_a_chat_tokenizer(model_dir, tokenizer):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    assert config.architectures == ["Qwen2ForCausalLM"]
    assert config.hidden_size // config.num_attention_heads >= 32  # vLLM's CPU attention needs it
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert len(tokenizer) <= 400 and config.vocab_size == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>"
    for token in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>"):
        assert tokenizer.convert_tokens_to_ids(token) != tokenizer.unk_token_id, token
    summary = json.loads((model_dir / "trajlake-model.json").read_text())
    assert summary["config"]["seed"] == 3


def test_auto_tokenizer_and_tokenizers_encode_every_probe_identically(model_dir, tokenizer):
    auto = tokenizer
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in probe_texts(auto):
        ids = auto.encode(text, add_special_tokens=False)
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert auto.decode(ids) == __import__("unicodedata").normalize("NFC", text)  # lossless after NFC


def test_a_tool_call_without_arguments_is_one_token_and_parses_as_the_template_renders_it(tokenizer):
    messages = [{"role": "user", "content": "calc 1 + 2"},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {}}}]}]  # fmt: skip
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tool_call_text("calc") in rendered
    for text in action_tokens(DEMO_TOOLS):
        assert len(tokenizer.encode(text, add_special_tokens=False)) == 1


def test_a_tokenizer_whose_pre_tokenizer_differs_is_caught(model_dir, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    spec = json.loads((broken / "tokenizer.json").read_text())
    spec["normalizer"] = {
        "type": "Lowercase"
    }  # what AutoTokenizer rebuilds ignores this; tokenizers does not
    (broken / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ModelInitError, match=r"encode .* differently"):
        check_tokenizers_agree(broken)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [({"hidden_size": 64, "num_heads": 4}, "head size .* below 32"), ({"num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads")],
    ids=["head-too-small", "kv-heads"],
)  # fmt: skip
def test_shapes_vllm_cannot_serve_are_refused_with_the_fix(overrides, match):
    with pytest.raises(ValueError, match=match):
        ModelInitConfig(**overrides)


def test_the_cli_refuses_a_non_empty_directory_and_a_bad_width(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("keep me")
    assert main(["model", "init", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "x.txt").read_text() == "keep me"
    assert main(["model", "init", str(tmp_path / "m"), "--width", "48", "--heads", "2"]) == 2
    assert "--width" in capsys.readouterr().err


def test_the_same_seed_gives_the_same_weights(tmp_path):
    from safetensors.torch import load_file

    a = init_model(tmp_path / "a", ModelInitConfig(seed=5))
    b = init_model(tmp_path / "b", ModelInitConfig(seed=5))
    wa, wb = (
        load_file(f"{a['model_dir']}/model.safetensors"),
        load_file(f"{b['model_dir']}/model.safetensors"),
    )
    assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)
