"""The matmul family's ladder cases moved to shaders/kernels/matmul/ (this name stays importable)."""

import sys

from ..kernels.matmul import cases as _moved

sys.modules[__name__] = _moved
