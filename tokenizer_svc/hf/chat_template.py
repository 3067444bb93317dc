"""Chat templates: a conversation rendered by a vocabulary's Jinja template, then tokenized,
with the ids of transformers' `apply_chat_template(messages, tokenize=True, ...)`.

    from tokenizer_svc.hf.chat_template import apply_chat_template
    ids = apply_chat_template(enc, [{"role": "user", "content": "Hi"}],
                              add_generation_prompt=True)

Where the template comes from (`ChatTemplate.find`, as transformers reads a folder): the
folder of a tokenizer.json vocabulary holds `chat_template.jinja` (the default template),
`chat_templates/NAME.jinja` (named ones) or `tokenizer_config.json` with `chat_template` (a
string, or a list of {"name", "template"}); the files win over the config. The config's
`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`, `cls_token`, `mask_token`
(strings or {"content": ...}; a legacy special_tokens_map.json overrides them when the config
has no added_tokens_decoder) and a dict `extra_special_tokens` are template variables.

How it renders (`ChatTemplate.render`): as transformers 4.45-5.x does, in an immutable
sandboxed Jinja2 environment (trim_blocks, lstrip_blocks, loop controls) with the helpers
transformers defines: `raise_exception(message)`, `strftime_now(format)`, a `tojson` filter
that does not escape HTML (ensure_ascii=False, indent, separators, sort_keys), `dict` and a
`namespace` that refuses underscore names; `{% generation %}` blocks render their body.
Messages are plain JSON data; keys whose value is None are dropped and `reasoning_content`
is filled from `thinking`/`reasoning` (and `thinking` from it), as transformers does; the
variables are `messages`, `tools`, `documents`, `add_generation_prompt`, the special tokens
and any caller's extras (which override them).

How it tokenizes (`tokenize_rendered`): as transformers after rendering, with
add_special_tokens=False: every added token spelled in the text (the template's control
tokens, and content that spells one: transformers' default) is that token
(`Encoding.encode_hf(text, add_special_tokens=False)`; for a .tiktoken vocabulary,
`encode(text, allowed_special="all")`).

Jinja2 is an optional dependency: `pip install istanbul[chat]`; `ChatTemplateUnavailable`
says so when it is missing. Templates come from the vocabulary's folder, so they are as
trusted as the vocabulary; the sandbox still keeps a template from reaching Python objects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "chat_templates"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")   # transformers' aliases
MIN_JINJA = (3, 1, 6)   # older releases have known sandbox escapes (transformers refuses them)


class ChatTemplateUnavailable(LookupError):
    """No chat template can be applied: the vocabulary has none, or Jinja2 is missing."""


class NoChatTemplate(ChatTemplateUnavailable):
    """The vocabulary's folder has no chat template at all."""


class ChatTemplateError(ValueError):
    """The template refused the conversation (its raise_exception) or failed to render it."""


@dataclass
class ChatTemplate:
    """A vocabulary's chat templates (name -> Jinja source, "default" first when there is
    one) and the variables transformers passes with them (bos_token, ...)."""

    templates: dict
    variables: dict = field(default_factory=dict)
    source: str = ""   # where it was found, for messages

    @classmethod
    def find(cls, vocab_source: str | Path) -> "ChatTemplate | None":
        """The chat template beside a vocabulary file (or in a folder), or None when there is
        none. ChatTemplateUnavailable names a file that is there but unreadable."""
        path = Path(vocab_source)
        folder = path if path.is_dir() else path.parent
        config = _read_json(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
        templates: dict = {}
        given = config.get("chat_template")
        if isinstance(given, str):
            templates["default"] = given
        elif isinstance(given, list):
            for item in given:
                if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                        and isinstance(item.get("template"), str)):
                    raise ChatTemplateUnavailable(
                        f"{folder / CONFIG_FILE}: chat_template is a list whose items must be "
                        f"{{\"name\": ..., \"template\": ...}}; got {str(item)[:80]}")
                templates[item["name"]] = item["template"]
        files: dict = {}
        if (folder / TEMPLATE_FILE).is_file():
            files["default"] = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
        if (folder / TEMPLATE_DIR).is_dir():
            for file in sorted((folder / TEMPLATE_DIR).glob("*.jinja")):
                files[file.stem] = file.read_text(encoding="utf-8")
        if files:   # transformers: the template files replace the config's templates
            templates = files
        if not templates:
            return None
        if "default" in templates:
            templates = {"default": templates.pop("default"), **templates}
        return cls(templates, _special_variables(folder, config),
                   str(folder / TEMPLATE_FILE) if files else str(folder / CONFIG_FILE))

    @property
    def names(self) -> list:
        return list(self.templates)

    def select(self, name: str | None = None, tools=None) -> str:
        """The Jinja source to use: `name`, else transformers' choice (a single template;
        "tool_use" when tools are given and there is one; else "default")."""
        if name:
            if name not in self.templates:
                raise ChatTemplateError(f"no chat template named {name!r}; this vocabulary has "
                                        f"{', '.join(map(repr, self.templates))}")
            return self.templates[name]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise ChatTemplateError(f"this vocabulary has several chat templates and no default "
                                f"({', '.join(map(repr, self.templates))}): name one")

    def render(self, messages: list, *, add_generation_prompt: bool = False, tools=None,
               documents=None, template: str | None = None, **variables) -> str:
        """The conversation as text (transformers' apply_chat_template(tokenize=False))."""
        source = self.select(template, tools)
        compiled = _compile(source)
        chat = _conversation(messages)
        if tools is not None and not isinstance(tools, list):
            raise ChatTemplateError(f"tools must be a list of tool schemas (JSON objects), not "
                                    f"{type(tools).__name__}")
        if documents is not None and (not isinstance(documents, list)
                                      or not all(isinstance(d, dict) for d in documents)):
            raise ChatTemplateError("documents must be a list of JSON objects (with 'title' "
                                    "and 'text', say)")
        context = {**self.variables, **_plain(variables)}
        import jinja2
        try:
            return compiled.render(messages=chat, tools=_plain(tools),
                                   documents=_plain(documents),
                                   add_generation_prompt=bool(add_generation_prompt), **context)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused the conversation: {exc}") \
                from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ChatTemplateError(f"the chat template failed on this conversation: "
                                    f"{type(exc).__name__}: {exc}") from None


def tokenize_rendered(encoding, text: str) -> list:
    """The ids of a rendered conversation, as transformers tokenizes it (module doc)."""
    if getattr(encoding, "_hf", None) is not None:
        return encoding.encode_hf(text, add_special_tokens=False)
    return encoding.encode(text, allowed_special="all")


def chat_template_of(encoding) -> ChatTemplate:
    """The chat template of `encoding`'s vocabulary (found beside its file); NoChatTemplate
    saying where it was looked for, or ChatTemplateUnavailable for an unreadable file."""
    source = getattr(encoding.vocab, "source", "")
    found = ChatTemplate.find(source) if source else None
    if found is None:
        where = Path(source).parent if source else "(the vocabulary has no file)"
        raise NoChatTemplate(
            f"the {encoding.name} vocabulary has no chat template: none of {CONFIG_FILE} (with "
            f"chat_template), {TEMPLATE_FILE} or {TEMPLATE_DIR}/*.jinja in {where}; put the "
            "model's tokenizer_config.json beside its tokenizer.json")
    return found


def apply_chat_template(encoding, messages: list, *, add_generation_prompt: bool = False,
                        tools=None, documents=None, template: str | None = None,
                        chat_template: ChatTemplate | None = None, **variables) -> list:
    """transformers' `apply_chat_template(messages, tokenize=True, ...)` ids with `encoding`:
    the conversation rendered by the vocabulary's template (or `chat_template`), then
    tokenized. ChatTemplateUnavailable / ChatTemplateError as `ChatTemplate` says."""
    chat_template = chat_template or chat_template_of(encoding)
    text = chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                tools=tools, documents=documents, template=template,
                                **variables)
    return tokenize_rendered(encoding, text)


# ---- transformers' rendering -----------------------------------------------------------------

def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChatTemplateUnavailable(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ChatTemplateUnavailable(f"{path}: expected a JSON object")
    return data


def _token_text(value):
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_variables(folder: Path, config: dict) -> dict:
    """bos_token, ... as transformers' `special_tokens_map` gives them to the template."""
    given = dict(config)
    legacy = folder / SPECIAL_TOKENS_MAP_FILE
    if "added_tokens_decoder" not in config and legacy.is_file():
        given.update(_read_json(legacy))
    names = list(SPECIAL_TOKEN_NAMES)
    extra = given.get("extra_special_tokens")
    if isinstance(extra, dict):   # model-specific named tokens (image_token, ...)
        names += [k for k in extra if k not in names]
        given = {**extra, **{k: v for k, v in given.items() if k in SPECIAL_TOKEN_NAMES}}
    out = {}
    for name in names:
        text = _token_text(given.get(name))
        if text is not None:
            out[name] = text
    return out


def check_jinja() -> None:
    """ChatTemplateUnavailable unless a usable Jinja2 is installed (what to install)."""
    _jinja()


def _jinja():
    try:
        import jinja2
    except ImportError:
        raise ChatTemplateUnavailable("chat templates need Jinja2: pip install "
                                      "'istanbul[chat]' (or jinja2>=3.1.6)") from None
    version = tuple(int(p) for p in jinja2.__version__.split(".")[:3] if p.isdigit())
    if version < MIN_JINJA:
        raise ChatTemplateUnavailable(f"chat templates need Jinja2 3.1.6 or newer (older ones "
                                      f"have sandbox escapes); found {jinja2.__version__}: pip "
                                      "install -U 'istanbul[chat]'")
    return jinja2


@lru_cache(maxsize=16)
def _compile(source: str):
    """The template compiled in transformers' environment (module doc)."""
    jinja2 = _jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text; it renders as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes on a "
                    f"namespace, but got {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=TemplateDict(), namespace=TemplateNamespace)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template is not valid Jinja (line {exc.lineno}: "
                                f"{exc.message})") from None


def _plain(value):
    """JSON data only (what transformers lets a template see)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value] if isinstance(value, list) else \
            tuple(_plain(v) for v in value)
    raise ChatTemplateError(f"chat template inputs are JSON data; got a "
                            f"{type(value).__name__}")


def _conversation(messages) -> list:
    """transformers' normalisation: dicts, None values dropped, reasoning fields aliased."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {\"role\", \"content\"} "
                                "objects")
    chat = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"message {n} must be an object with \"role\" and "
                                    f"\"content\", not {type(message).__name__}")
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in REASONING_FIELDS
                          if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        chat.append(message)
    return chat
