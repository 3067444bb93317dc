"""KV-cache decoding moved to shaders/kernels/attention/ (this name stays importable)."""

import sys

from ..kernels.attention import decode as _moved

sys.modules[__name__] = _moved
