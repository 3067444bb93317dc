# Post-processed by tokenizer_svc.service.rpc.generate (grpcio-tools 1.85.4): version gates removed, relative import.
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetUnit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OFFSET_UNIT_NONE: _ClassVar[OffsetUnit]
    OFFSET_UNIT_BYTE: _ClassVar[OffsetUnit]
    OFFSET_UNIT_CHAR: _ClassVar[OffsetUnit]

class IdFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ID_FORMAT_REPEATED: _ClassVar[IdFormat]
    ID_FORMAT_PACKED: _ClassVar[IdFormat]

class TruncationSide(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRUNCATION_SIDE_RIGHT: _ClassVar[TruncationSide]
    TRUNCATION_SIDE_LEFT: _ClassVar[TruncationSide]

class DecodeMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECODE_MODE_BYTES: _ClassVar[DecodeMode]
    DECODE_MODE_TEXT_STRICT: _ClassVar[DecodeMode]
    DECODE_MODE_TEXT_REPLACE: _ClassVar[DecodeMode]
OFFSET_UNIT_NONE: OffsetUnit
OFFSET_UNIT_BYTE: OffsetUnit
OFFSET_UNIT_CHAR: OffsetUnit
ID_FORMAT_REPEATED: IdFormat
ID_FORMAT_PACKED: IdFormat
TRUNCATION_SIDE_RIGHT: TruncationSide
TRUNCATION_SIDE_LEFT: TruncationSide
DECODE_MODE_BYTES: DecodeMode
DECODE_MODE_TEXT_STRICT: DecodeMode
DECODE_MODE_TEXT_REPLACE: DecodeMode

class ItemError(_message.Message):
    __slots__ = ("index", "code", "reason", "message", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    code: int
    reason: str
    message: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, index: _Optional[int] = ..., code: _Optional[int] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SpecialTokenPolicy(_message.Message):
    __slots__ = ("allow_all", "allowed", "disallow_none", "disallowed")
    ALLOW_ALL_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    DISALLOW_NONE_FIELD_NUMBER: _ClassVar[int]
    DISALLOWED_FIELD_NUMBER: _ClassVar[int]
    allow_all: bool
    allowed: _containers.RepeatedScalarFieldContainer[str]
    disallow_none: bool
    disallowed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, allow_all: _Optional[bool] = ..., allowed: _Optional[_Iterable[str]] = ..., disallow_none: _Optional[bool] = ..., disallowed: _Optional[_Iterable[str]] = ...) -> None: ...

class Truncation(_message.Message):
    __slots__ = ("max_tokens", "side")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    side: TruncationSide
    def __init__(self, max_tokens: _Optional[int] = ..., side: _Optional[_Union[TruncationSide, str]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "data", "special", "offsets", "truncation", "id", "format", "token_texts")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TEXTS_FIELD_NUMBER: _ClassVar[int]
    text: str
    data: bytes
    special: SpecialTokenPolicy
    offsets: OffsetUnit
    truncation: Truncation
    id: str
    format: IdFormat
    token_texts: bool
    def __init__(self, text: _Optional[str] = ..., data: _Optional[bytes] = ..., special: _Optional[_Union[SpecialTokenPolicy, _Mapping]] = ..., offsets: _Optional[_Union[OffsetUnit, str]] = ..., truncation: _Optional[_Union[Truncation, _Mapping]] = ..., id: _Optional[str] = ..., format: _Optional[_Union[IdFormat, str]] = ..., token_texts: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("ids", "token_count", "truncated", "id", "ids_packed", "starts", "ends", "offsets_packed", "texts", "special")
    IDS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_PACKED_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    token_count: int
    truncated: bool
    id: str
    ids_packed: bytes
    starts: _containers.RepeatedScalarFieldContainer[int]
    ends: _containers.RepeatedScalarFieldContainer[int]
    offsets_packed: bytes
    texts: _containers.RepeatedScalarFieldContainer[str]
    special: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., token_count: _Optional[int] = ..., truncated: _Optional[bool] = ..., id: _Optional[str] = ..., ids_packed: _Optional[bytes] = ..., starts: _Optional[_Iterable[int]] = ..., ends: _Optional[_Iterable[int]] = ..., offsets_packed: _Optional[bytes] = ..., texts: _Optional[_Iterable[str]] = ..., special: _Optional[_Iterable[bool]] = ...) -> None: ...

class TokenizeBatchRequest(_message.Message):
    __slots__ = ("texts", "data", "special", "offsets", "truncation", "format", "per_item_errors")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PER_ITEM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    data: _containers.RepeatedScalarFieldContainer[bytes]
    special: SpecialTokenPolicy
    offsets: OffsetUnit
    truncation: Truncation
    format: IdFormat
    per_item_errors: bool
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., data: _Optional[_Iterable[bytes]] = ..., special: _Optional[_Union[SpecialTokenPolicy, _Mapping]] = ..., offsets: _Optional[_Union[OffsetUnit, str]] = ..., truncation: _Optional[_Union[Truncation, _Mapping]] = ..., format: _Optional[_Union[IdFormat, str]] = ..., per_item_errors: _Optional[bool] = ...) -> None: ...

class TokenizeBatchResponse(_message.Message):
    __slots__ = ("ids", "doc_offsets", "token_counts", "ids_packed", "starts", "ends", "offsets_packed", "errors")
    IDS_FIELD_NUMBER: _ClassVar[int]
    DOC_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNTS_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    STARTS_FIELD_NUMBER: _ClassVar[int]
    ENDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_PACKED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    doc_offsets: _containers.RepeatedScalarFieldContainer[int]
    token_counts: _containers.RepeatedScalarFieldContainer[int]
    ids_packed: bytes
    starts: _containers.RepeatedScalarFieldContainer[int]
    ends: _containers.RepeatedScalarFieldContainer[int]
    offsets_packed: bytes
    errors: _containers.RepeatedCompositeFieldContainer[ItemError]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., doc_offsets: _Optional[_Iterable[int]] = ..., token_counts: _Optional[_Iterable[int]] = ..., ids_packed: _Optional[bytes] = ..., starts: _Optional[_Iterable[int]] = ..., ends: _Optional[_Iterable[int]] = ..., offsets_packed: _Optional[bytes] = ..., errors: _Optional[_Iterable[_Union[ItemError, _Mapping]]] = ...) -> None: ...

class CountTokensRequest(_message.Message):
    __slots__ = ("text", "data", "special")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    data: bytes
    special: SpecialTokenPolicy
    def __init__(self, text: _Optional[str] = ..., data: _Optional[bytes] = ..., special: _Optional[_Union[SpecialTokenPolicy, _Mapping]] = ...) -> None: ...

class CountTokensResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("ids", "mode", "id", "ids_packed")
    IDS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    mode: DecodeMode
    id: str
    ids_packed: bytes
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., mode: _Optional[_Union[DecodeMode, str]] = ..., id: _Optional[str] = ..., ids_packed: _Optional[bytes] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("data", "text", "id")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    text: str
    id: str
    def __init__(self, data: _Optional[bytes] = ..., text: _Optional[str] = ..., id: _Optional[str] = ...) -> None: ...

class DetokenizeBatchRequest(_message.Message):
    __slots__ = ("ids", "seq_offsets", "mode", "ids_packed", "per_item_errors")
    IDS_FIELD_NUMBER: _ClassVar[int]
    SEQ_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    PER_ITEM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    seq_offsets: _containers.RepeatedScalarFieldContainer[int]
    mode: DecodeMode
    ids_packed: bytes
    per_item_errors: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., seq_offsets: _Optional[_Iterable[int]] = ..., mode: _Optional[_Union[DecodeMode, str]] = ..., ids_packed: _Optional[bytes] = ..., per_item_errors: _Optional[bool] = ...) -> None: ...

class DetokenizeBatchResponse(_message.Message):
    __slots__ = ("data", "texts", "errors")
    DATA_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    data: _containers.RepeatedScalarFieldContainer[bytes]
    texts: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedCompositeFieldContainer[ItemError]
    def __init__(self, data: _Optional[_Iterable[bytes]] = ..., texts: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[_Union[ItemError, _Mapping]]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("max_message_bytes", "max_text_bytes", "max_batch_items", "max_decode_ids", "max_queued_bytes", "max_stream_inflight")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    MAX_DECODE_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_STREAM_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_text_bytes: int
    max_batch_items: int
    max_decode_ids: int
    max_queued_bytes: int
    max_stream_inflight: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_text_bytes: _Optional[int] = ..., max_batch_items: _Optional[int] = ..., max_decode_ids: _Optional[int] = ..., max_queued_bytes: _Optional[int] = ..., max_stream_inflight: _Optional[int] = ...) -> None: ...

class Batching(_message.Message):
    __slots__ = ("window_ms", "max_items", "max_bytes")
    WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_ITEMS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    window_ms: float
    max_items: int
    max_bytes: int
    def __init__(self, window_ms: _Optional[float] = ..., max_items: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "type", "backend", "driver", "software")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    backend: str
    driver: str
    software: bool
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., backend: _Optional[str] = ..., driver: _Optional[str] = ..., software: _Optional[bool] = ...) -> None: ...

class GetInfoResponse(_message.Message):
    __slots__ = ("vocabulary_name", "vocabulary_hash", "n_vocab", "special_tokens", "eot_token", "pattern", "limits", "batching", "adapter", "server_version", "chat_templates")
    class SpecialTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VOCABULARY_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCABULARY_HASH_FIELD_NUMBER: _ClassVar[int]
    N_VOCAB_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EOT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    vocabulary_name: str
    vocabulary_hash: str
    n_vocab: int
    special_tokens: _containers.ScalarMap[str, int]
    eot_token: int
    pattern: str
    limits: Limits
    batching: Batching
    adapter: Adapter
    server_version: str
    chat_templates: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, vocabulary_name: _Optional[str] = ..., vocabulary_hash: _Optional[str] = ..., n_vocab: _Optional[int] = ..., special_tokens: _Optional[_Mapping[str, int]] = ..., eot_token: _Optional[int] = ..., pattern: _Optional[str] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., batching: _Optional[_Union[Batching, _Mapping]] = ..., adapter: _Optional[_Union[Adapter, _Mapping]] = ..., server_version: _Optional[str] = ..., chat_templates: _Optional[_Iterable[str]] = ...) -> None: ...

class ChunkRequest(_message.Message):
    __slots__ = ("texts", "data", "max_tokens", "overlap", "special", "format", "per_item_errors")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PER_ITEM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    data: _containers.RepeatedScalarFieldContainer[bytes]
    max_tokens: int
    overlap: int
    special: SpecialTokenPolicy
    format: IdFormat
    per_item_errors: bool
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., data: _Optional[_Iterable[bytes]] = ..., max_tokens: _Optional[int] = ..., overlap: _Optional[int] = ..., special: _Optional[_Union[SpecialTokenPolicy, _Mapping]] = ..., format: _Optional[_Union[IdFormat, str]] = ..., per_item_errors: _Optional[bool] = ...) -> None: ...

class ChunkWindow(_message.Message):
    __slots__ = ("token_start", "token_end", "start", "end", "byte_start", "byte_end")
    TOKEN_START_FIELD_NUMBER: _ClassVar[int]
    TOKEN_END_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BYTE_START_FIELD_NUMBER: _ClassVar[int]
    BYTE_END_FIELD_NUMBER: _ClassVar[int]
    token_start: int
    token_end: int
    start: int
    end: int
    byte_start: int
    byte_end: int
    def __init__(self, token_start: _Optional[int] = ..., token_end: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., byte_start: _Optional[int] = ..., byte_end: _Optional[int] = ...) -> None: ...

class ChunkedDocument(_message.Message):
    __slots__ = ("ids", "ids_packed", "windows")
    IDS_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    ids_packed: bytes
    windows: _containers.RepeatedCompositeFieldContainer[ChunkWindow]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., ids_packed: _Optional[bytes] = ..., windows: _Optional[_Iterable[_Union[ChunkWindow, _Mapping]]] = ...) -> None: ...

class ChunkResponse(_message.Message):
    __slots__ = ("documents", "errors")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[ChunkedDocument]
    errors: _containers.RepeatedCompositeFieldContainer[ItemError]
    def __init__(self, documents: _Optional[_Iterable[_Union[ChunkedDocument, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[ItemError, _Mapping]]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ApplyChatTemplateRequest(_message.Message):
    __slots__ = ("messages", "messages_json", "add_generation_prompt", "tools_json", "documents_json", "variables_json", "template", "format")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    VARIABLES_JSON_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    messages_json: str
    add_generation_prompt: bool
    tools_json: str
    documents_json: str
    variables_json: str
    template: str
    format: IdFormat
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., messages_json: _Optional[str] = ..., add_generation_prompt: _Optional[bool] = ..., tools_json: _Optional[str] = ..., documents_json: _Optional[str] = ..., variables_json: _Optional[str] = ..., template: _Optional[str] = ..., format: _Optional[_Union[IdFormat, str]] = ...) -> None: ...

class ApplyChatTemplateResponse(_message.Message):
    __slots__ = ("ids", "ids_packed", "text", "token_count")
    IDS_FIELD_NUMBER: _ClassVar[int]
    IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_COUNT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    ids_packed: bytes
    text: str
    token_count: int
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., ids_packed: _Optional[bytes] = ..., text: _Optional[str] = ..., token_count: _Optional[int] = ...) -> None: ...
