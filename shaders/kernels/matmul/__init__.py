"""The matmul family: every Linear layer's three products (see ops.py)."""
