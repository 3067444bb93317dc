"""The matmul family moved to shaders/kernels/matmul/ (this name stays importable)."""

import sys

from ..kernels.matmul import ops as _moved

sys.modules[__name__] = _moved
