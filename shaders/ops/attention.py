"""The attention family moved to shaders/kernels/attention/ (this name stays importable)."""

import sys

from ..kernels.attention import ops as _moved

sys.modules[__name__] = _moved
