"""`--server HOST:PORT` for the istanbul commands: the options and the client they make."""

from __future__ import annotations

import argparse

import pytest

from istanbul.errors import UserFacingError
from tokenizer_svc.client import add_server_arguments, client_from_args
from tests.service_support import (TEXTS, free_port, server, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)


def _parse(*argv):
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(argv)


def test_server_option_gives_a_client_equal_to_the_local_encoding(server, tiny_encoding):
    client = client_from_args(_parse("--server", server.target))
    try:
        for text in TEXTS:
            assert client.encode(text) == list(tiny_encoding.encode(text))
            assert client.decode(client.encode(text)) == tiny_encoding.decode(
                tiny_encoding.encode(text))
    finally:
        client.close()


def test_unreachable_server_is_a_clear_user_error():
    args = _parse("--server", f"127.0.0.1:{free_port()}")
    with pytest.raises(UserFacingError, match=r"--server 127\.0\.0\.1:\d+: .*istanbul serve"):
        client_from_args(args)
