"""Recorder.copy with byte offsets (unaligned rows: KV-cache appends, the last row of x)."""

import numpy as np


def test_copy_with_source_and_destination_offsets(device):
    src = device.upload(np.arange(12, dtype=np.float32))
    dst = device.upload(np.zeros(10, np.float32))
    with device.record() as rec:
        rec.copy(src, dst, 3 * 4, src_offset=5 * 4, dst_offset=2 * 4)
    np.testing.assert_array_equal(dst.read(), [0, 0, 5, 6, 7, 0, 0, 0, 0, 0])
    with device.record() as rec:  # without a size: the rest of the shorter side
        rec.copy(src, dst, src_offset=8 * 4)
    np.testing.assert_array_equal(dst.read(), [8, 9, 10, 11, 7, 0, 0, 0, 0, 0])
