"""The pieces of the embedding engine's device step on their own: the partition slots as one
buffer. The whole step against the Rust engine is tests/test_embed_device.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from strata.embed.device.backend import SlotBuffer  # noqa: E402


def test_the_slot_buffer_grows_keeping_what_its_slots_hold():
    buf = SlotBuffer(torch.device("cpu"))
    first = buf.place(12, 4)  # 4 rows of 3 reals, one state a row
    buf.region(first, 12, 4).params.copy_(torch.arange(12.0))
    second = buf.place(18, 6)  # larger: every slot grows to 6 rows, the first kept
    assert (first, second) == (0, 1) and buf.size == (18, 6)
    table, slot_rows = buf.rows(3)
    assert slot_rows == 6 and table.params.shape == (12, 3) and table.state.shape == (12, 1)
    # Row r of the partition in slot i is buffer row i * slot_rows + r.
    assert table.params[0 * slot_rows + 2].tolist() == [6.0, 7.0, 8.0]
    buf.release(first)
    assert buf.place(6, 2) == first and buf.size == (18, 6)
    with pytest.raises(ValueError, match="do not hold whole rows of 4 reals"):
        buf.rows(4)
