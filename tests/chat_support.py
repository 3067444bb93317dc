"""A DeepSeek-style chat folder for the chat-template tests: the real DeepSeek tokenizer.json
from ../shared/vocab copied beside a tokenizer_config.json with a template written here (it
uses what real templates use: a namespace, loop controls, tojson, raise_exception,
strftime_now, dict, a generation block, tools and tool calls, reasoning fields)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import shared_vocab

TEMPLATE = """\
{%- set ns = namespace(system='', calls=0) -%}
{%- for m in messages if m['role'] == 'system' -%}{%- set ns.system = ns.system + m['content'] -%}{%- endfor -%}
{{ bos_token }}{{ ns.system }}
{%- if date is defined %} Today: {{ strftime_now(date) }}.{% endif %}
{%- if tools %}

## Tools
{% for tool in tools %}{{ tool | tojson(indent=2) }}
{% endfor %}
{%- endif %}
{%- for m in messages -%}
  {%- if m['role'] == 'system' -%}{%- continue -%}
  {%- elif m['role'] == 'user' -%}<｜User｜>{{ m['content'] }}
  {%- elif m['role'] == 'assistant' -%}<｜Assistant｜>
    {%- if m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>{% endif %}
    {%- generation %}{{ m['content'] }}{% endgeneration %}
    {%- for call in m.get('tool_calls', []) %}{% set ns.calls = ns.calls + 1 %}<｜tool▁call▁begin｜>{{ call['function']['name'] }}<｜tool▁sep｜>{{ call['function']['arguments'] | tojson(sort_keys=true) }}<｜tool▁call▁end｜>{% endfor %}{{ eos_token }}
  {%- elif m['role'] == 'tool' -%}<｜tool▁output▁begin｜>{{ m['content'] }}<｜tool▁output▁end｜>
  {%- else -%}{{ raise_exception('unknown role: ' + m['role']) }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<｜Assistant｜>{% if thinking is defined and not thinking %}</think>{% endif %}{% endif %}
{%- if debug is defined %}{{ dict(calls=ns.calls) | tojson }}{% endif %}"""

TOOL_TEMPLATE = "{{ bos_token }}[tools: {{ tools | map(attribute='name') | join(',') }}]" \
                "{% for m in messages %}<｜User｜>{{ m['content'] }}{% endfor %}"

CONFIG = {
    "add_bos_token": False, "add_eos_token": False,
    "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": False,
                  "normalized": True, "rstrip": False, "single_word": False},
    "eos_token": {"__type": "AddedToken", "content": "<｜end▁of▁sentence｜>", "lstrip": False,
                  "normalized": True, "rstrip": False, "single_word": False},
    "pad_token": "<｜▁pad▁｜>",
    "tokenizer_class": "PreTrainedTokenizerFast",
    "model_max_length": 131072,
    "chat_template": TEMPLATE,
}

CONVERSATIONS = [
    [{"role": "user", "content": "Merhaba! İstanbul'da hava nasıl? 🙂"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4", "thinking": "Add them."},
     {"role": "user", "content": "And <｜User｜> spelled in content, 日本語, \n\n  spaces "}],
    [{"role": "user", "content": "Weather in Ankara?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"type": "function", "function": {"name": "get_weather",
                                           "arguments": {"city": "Ankara", "unit": "°C"}}}]},
     {"role": "tool", "content": "{\"temp\": 21}"},
     {"role": "assistant", "content": "21 °C, sunny."}],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city <b>now</b>",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def deepseek_chat_folder(folder: Path, config: dict | None = None, files: dict | None = None
                         ) -> Path:
    """`folder` with the DeepSeek tokenizer.json, tokenizer_config.json (`config`, default
    CONFIG) and any other `files` (name -> text); skips the test when the vocabulary is
    absent."""
    source = shared_vocab("deepseek_tokenizer.json")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(CONFIG if config is None else config, ensure_ascii=False), encoding="utf-8")
    for name, text in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder
