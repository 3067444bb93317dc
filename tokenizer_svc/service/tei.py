"""tei.v1.Tokenize: Hugging Face text-embeddings-inference's tokenizer API on the same port.

TEI clients (its Python/Rust/Node stubs, grpcurl scripts) call Tokenize, TokenizeStream,
Decode and DecodeStream exactly as they would on a TEI server (proto/tei/v1/tei.proto). The
requests go through the same batcher, long lane, limits, deadlines and metrics as
istanbul.tokenizer.v1; only the translation between TEI's messages and the jobs lives here:

- Tokenize: every special token of the vocabulary in `inputs` is recognised (as TEI's
  tokenizer does with added tokens); `add_special_tokens` adds the vocabulary's
  post-processor tokens (tokenizer.json templates: BOS/EOS; a .tiktoken vocabulary has none).
  Special tokens carry their spelling and no start/stop; other tokens their byte range
  [start, stop) in the UTF-8 input and their text (U+FFFD for the bytes of a character split
  between tokens, where TEI repeats the whole character).
- Decode: `skip_special_tokens` drops the special tokens, the rest is decoded with invalid
  UTF-8 replaced (TEI's `decode`).
- `prompt_name` (TEI's sentence-transformers prompts) is refused: this server has no prompts.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from .rpc import tei_pb2
from . import limits as checks
from .limits import utf8_len
from .errors import bad_argument, parsed
from .servicer import TokenizerServicer, streaming, tolerant_deserializer, unary
from .work import DecodeJob, EncodeJob, SpecialRule, post_process

TEI_SERVICE = tei_pb2.DESCRIPTOR.services_by_name["Tokenize"]
TEI_SERVICE_NAME = TEI_SERVICE.full_name   # "tei.v1.Tokenize"


class TeiTokenizeServicer:
    """The tei.v1.Tokenize methods, run by the main servicer's batcher and limits."""

    def __init__(self, main: TokenizerServicer):
        self.main = main

    @property
    def batcher(self):   # the `unary` wrapper announces requests to it
        return self.main.batcher

    def method_handlers(self) -> dict:
        handlers = {}
        for method in TEI_SERVICE.methods:
            request_cls = getattr(tei_pb2, method.input_type.name)
            response_cls = getattr(tei_pb2, method.output_type.name)
            make = (grpc.stream_stream_rpc_method_handler if method.client_streaming
                    else grpc.unary_unary_rpc_method_handler)
            handlers[method.name] = make(
                getattr(self, method.name),
                request_deserializer=tolerant_deserializer(request_cls, self.main.limits),
                response_serializer=response_cls.SerializeToString)
        return handlers

    # ---- Tokenize -------------------------------------------------------------------------

    async def _tokenize(self, request, context, method: str) -> tei_pb2.EncodeResponse:
        request = parsed(request)
        main = self.main
        main._ready()
        if request.HasField("prompt_name"):
            raise bad_argument(f"`prompt_name` {request.prompt_name!r}: this server has no prompts "
                       "(leave the field unset)")
        text = request.inputs
        nbytes = utf8_len(text)
        checks.check_text_bytes(main.limits, nbytes, "`inputs`")
        enc = main.encoding
        rule = SpecialRule.from_policy(enc.vocab.special_tokens, allow_all=True)
        [doc] = await main._run(EncodeJob([text], rule, "byte"), 1, nbytes, context, method)
        main.metrics.tokens_of["encode"].inc(doc.ids.size)
        ids, starts, stops = doc.ids, doc.offsets, doc.ends
        if request.add_special_tokens:
            ids, starts, stops = _with_post_processor(enc, ids, starts, stops)
        texts, special = main._token_texts(ids)
        special = special.tolist()
        reply = tei_pb2.EncodeResponse()
        tokens = reply.tokens
        for k, (token, token_text, is_special) in enumerate(zip(ids.tolist(), texts, special)):
            if is_special or starts[k] < 0:
                tokens.add(id=token, text=token_text, special=True)
            else:
                tokens.add(id=token, text=token_text, special=False, start=int(starts[k]),
                           stop=int(stops[k]))
        return reply

    @unary
    async def Tokenize(self, request, context):
        return await self._tokenize(request, context, "tei/Tokenize")

    @streaming
    async def TokenizeStream(self, request_iterator, context):
        async for response in self.main._pipelined(
                request_iterator,
                lambda request, n: self._tokenize(request, context, "tei/TokenizeStream"),
                context):
            yield response

    # ---- Decode ---------------------------------------------------------------------------

    async def _decode(self, request, context, method: str) -> tei_pb2.DecodeResponse:
        request = parsed(request)
        main = self.main
        main._ready()
        ids = np.asarray(request.ids, dtype=np.uint32)
        checks.check_decode_ids(main.limits, ids.size)
        enc = main.encoding
        hf = getattr(enc.vocab, "hf", None)
        if hf is not None and not hf.byte_level_decoder:   # tokenizers joins token strings
            text = await asyncio.get_running_loop().run_in_executor(
                None, enc.decode_hf, ids.tolist(), request.skip_special_tokens)
            return tei_pb2.DecodeResponse(text=text)
        if request.skip_special_tokens:
            ids = ids[~np.isin(ids, main.special_id_array())]
        [data] = await main._run(DecodeJob([ids]), 1, 4 * ids.size, context, method)
        main.metrics.tokens_of["decode"].inc(ids.size)
        return tei_pb2.DecodeResponse(text=data.decode("utf-8", "replace"))

    @unary
    async def Decode(self, request, context):
        return await self._decode(request, context, "tei/Decode")

    @streaming
    async def DecodeStream(self, request_iterator, context):
        async for response in self.main._pipelined(
                request_iterator,
                lambda request, n: self._decode(request, context, "tei/DecodeStream"),
                context):
            yield response


def _with_post_processor(enc, ids, starts, stops):
    """ids with the post-processor's tokens around them; added tokens get start -1."""
    full = np.asarray(post_process(enc, ids.tolist()), np.uint32)
    if full.size == ids.size:
        return ids, starts, stops
    n = ids.size
    at = next((k for k in range(full.size - n + 1) if np.array_equal(full[k:k + n], ids)), None)
    if at is None:
        raise RuntimeError("the post-processor did not keep the sequence's ids in one run")
    new_starts = np.full(full.size, -1, np.int64)
    new_stops = np.full(full.size, -1, np.int64)
    new_starts[at:at + n], new_stops[at:at + n] = starts, stops
    return full, new_starts, new_stops
