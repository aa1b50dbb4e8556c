"""apply_chat_template: shared by the server and LLM.chat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.entrypoints.chat_utils import (ChatTemplateError, apply_chat_template,
                                           load_chat_template)

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi there"}]


def test_renders_chatml_with_generation_prompt(tokenizer: Any) -> None:
    text = apply_chat_template(tokenizer, MESSAGES)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there"
                    "<|im_end|>\n<|im_start|>assistant\n")
    assert not apply_chat_template(tokenizer, MESSAGES, add_generation_prompt=False) \
        .endswith("assistant\n")


def test_content_parts_equal_plain_string(tokenizer: Any) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}]
    assert apply_chat_template(tokenizer, parts) == \
        apply_chat_template(tokenizer, [{"role": "user", "content": "Hi there"}])


def test_extra_message_keys_are_ignored(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi there", "weird_key": {"x": 1}}]
    assert "Hi there" in apply_chat_template(tokenizer, messages)


def test_continue_final_message(tokenizer: Any) -> None:
    messages = MESSAGES + [{"role": "assistant", "content": "Sure, the"}]
    text = apply_chat_template(tokenizer, messages, add_generation_prompt=False,
                               continue_final_message=True)
    assert text.endswith("Sure, the")
    with pytest.raises(ValueError):
        apply_chat_template(tokenizer, messages, add_generation_prompt=True,
                            continue_final_message=True)


def test_no_template_names_the_flag(tiny_base_model_dir: Path) -> None:
    from transformers import AutoTokenizer
    base = AutoTokenizer.from_pretrained(str(tiny_base_model_dir))
    with pytest.raises(ChatTemplateError) as info:
        apply_chat_template(base, MESSAGES)
    assert isinstance(info.value, ValueError)
    assert "--chat-template" in str(info.value) and "chat_template" in str(info.value)
    # An explicit template makes it work.
    text = apply_chat_template(base, MESSAGES, chat_template="{% for m in messages %}"
                               "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    assert text == "system: Be brief.\nuser: Hi there\n"


def test_load_chat_template(tmp_path: Path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert load_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert load_chat_template("{% if x %}y{% endif %}") == "{% if x %}y{% endif %}"
    assert load_chat_template(None) is None
    with pytest.raises(ValueError, match="neither a file"):
        load_chat_template(str(tmp_path / "missing.jinja"))
