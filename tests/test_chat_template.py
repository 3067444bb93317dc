"""tokenizer_svc.hf.chat_template against transformers: the same rendered text and the same ids as
`AutoTokenizer.from_pretrained(folder).apply_chat_template(...)` for the DeepSeek tokenizer
with chat templates in each place transformers reads them from."""

from __future__ import annotations

import sys

import pytest

from tests.chat_support import (CONFIG, CONVERSATIONS, TEMPLATE, TOOL_TEMPLATE, TOOLS,
                                deepseek_chat_folder)
from tokenizer_svc.hf.chat_template import (ChatTemplate, ChatTemplateError,
                                         ChatTemplateUnavailable, _compile, apply_chat_template,
                                         chat_template_of)

pytest.importorskip("transformers")
pytest.importorskip("jinja2")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return deepseek_chat_folder(tmp_path_factory.mktemp("deepseek"))


@pytest.fixture(scope="module")
def encoding(folder, device):
    from tokenizer_svc.encoding import get_encoding
    return get_encoding(str(folder / "tokenizer.json"), device=device)


def hf_tokenizer(folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def hf(folder):
    return hf_tokenizer(folder)


def both(encoding, hf, messages, **kwargs):
    """(ours, transformers'): (rendered text, ids) of one conversation."""
    ours = chat_template_of(encoding).render(messages, **kwargs)
    theirs = hf.apply_chat_template(messages, tokenize=False, **kwargs)
    ids = apply_chat_template(encoding, messages, **kwargs)
    want = hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
    return (ours, ids), (theirs, want)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_ids_and_text_equal_transformers(encoding, hf, index, generation_prompt):
    ours, theirs = both(encoding, hf, CONVERSATIONS[index],
                        add_generation_prompt=generation_prompt)
    assert ours == theirs
    assert ours[1][0] == 0   # the template's bos_token became the BOS id


def test_tools_variables_and_helpers_equal_transformers(encoding, hf):
    messages = CONVERSATIONS[2]
    for kwargs in ({"tools": TOOLS}, {"add_generation_prompt": True, "thinking": False},
                   {"date": "%Y", "debug": True}, {"tools": TOOLS, "documents": [
                       {"title": "a", "text": "b"}]}):
        ours, theirs = both(encoding, hf, messages, **kwargs)
        assert ours == theirs, kwargs
    assert '"description": "Weather of a city <b>now</b>"' in ours[0]   # tojson, not escaped
    assert '"calls": 1' in both(encoding, hf, messages, debug=True)[0][0]


def test_the_template_refuses_with_its_own_message(encoding, hf):
    messages = [{"role": "robot", "content": "beep"}]
    with pytest.raises(ChatTemplateError, match="unknown role: robot"):
        apply_chat_template(encoding, messages)
    with pytest.raises(Exception, match="unknown role: robot"):
        hf.apply_chat_template(messages, tokenize=False)


def test_the_sandbox_keeps_python_out(encoding):
    escape = ChatTemplate({"default": "{{ messages.__class__.__mro__[1].__subclasses__() }}"})
    with pytest.raises(ChatTemplateError, match="refused|failed"):
        escape.render([{"role": "user", "content": "x"}])
    store = ChatTemplate({"default": "{% set ns = namespace(_x=1) %}{{ ns._x }}"})
    with pytest.raises(ChatTemplateError, match="underscore"):
        store.render([{"role": "user", "content": "x"}])


def test_templates_from_files_and_named_lists_equal_transformers(tmp_path, device):
    """chat_template.jinja beats the config; a list of named templates picks tool_use when
    tools are given; special_tokens_map.json supplies the special tokens."""
    from tokenizer_svc.encoding import get_encoding
    config = {k: v for k, v in CONFIG.items() if k not in ("chat_template", "bos_token",
                                                            "eos_token")}
    config["chat_template"] = [{"name": "default", "template": TEMPLATE},
                               {"name": "tool_use", "template": TOOL_TEMPLATE}]
    named = deepseek_chat_folder(tmp_path / "named", config, {"special_tokens_map.json": (
        '{"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}')})
    tools = [{"name": "search"}, {"name": "read"}]
    # (get_encoding may hand back the module's Encoding of the same tokenizer.json, whose
    # source is the other folder: the template is passed explicitly)
    encoding = get_encoding(str(named / "tokenizer.json"), device=device)
    hf = hf_tokenizer(named)
    template = ChatTemplate.find(named / "tokenizer.json")
    assert template.names == ["default", "tool_use"]
    for kwargs in ({}, {"tools": tools}, {"chat_template": "tool_use", "tools": tools}):
        ours_kwargs = dict(kwargs)
        if "chat_template" in ours_kwargs:
            ours_kwargs["template"] = ours_kwargs.pop("chat_template")
        ids = apply_chat_template(encoding, CONVERSATIONS[1], chat_template=template,
                                  **ours_kwargs)
        assert ids == hf.apply_chat_template(CONVERSATIONS[1], tokenize=True,
                                             return_dict=False, **kwargs), kwargs
    assert "[tools: search,read]" in template.render(CONVERSATIONS[0], tools=tools)

    jinja_file = deepseek_chat_folder(tmp_path / "file", files={
        "chat_template.jinja": "{{ bos_token }}FILE{% for m in messages %}{{ m['content'] }}"
                               "{% endfor %}"})
    hf = hf_tokenizer(jinja_file)
    template = ChatTemplate.find(jinja_file / "tokenizer.json")
    assert template.names == ["default"]
    text = template.render(CONVERSATIONS[0])
    assert text.startswith("<｜begin▁of▁sentence｜>FILE")
    assert text == hf.apply_chat_template(CONVERSATIONS[0], tokenize=False)


def test_no_template_and_no_jinja_say_what_to_do(tmp_path, monkeypatch, encoding):
    from tests.service_support import write_tiny_vocabulary
    from tokenizer_svc.encoding import get_encoding
    tiny = get_encoding(str(write_tiny_vocabulary(tmp_path)), device="cpu")
    with pytest.raises(ChatTemplateUnavailable, match="tokenizer_config.json"):
        apply_chat_template(tiny, CONVERSATIONS[0])
    _compile.cache_clear()
    monkeypatch.setitem(sys.modules, "jinja2", None)   # as if it were not installed
    with pytest.raises(ChatTemplateUnavailable, match=r"istanbul\[chat\]"):
        apply_chat_template(encoding, CONVERSATIONS[0])
    _compile.cache_clear()


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty"), ("hello", "non-empty"), (["hello"], "message 0"),
    ([{"role": "user", "content": object()}], "JSON data"),
])
def test_bad_conversations_are_refused(encoding, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        apply_chat_template(encoding, messages)
