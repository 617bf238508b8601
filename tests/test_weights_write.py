"""strata.weights.write replaces a served-weights file atomically: a write that fails half way
leaves the old file as it was and no temporary file beside it, in both formats."""

from __future__ import annotations

import numpy as np
import pytest

from strata import weights

ARCH = {"kind": "sage", "in_dim": 3, "hidden_dim": 4, "out_dim": 2, "layers": 2, "fanouts": [5, 5]}


@pytest.mark.parametrize("name", ["m.safetensors", "m.npz"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, name):
    path = tmp_path / name
    weights.write(path, {"w": np.ones((3, 4), dtype=np.float32)}, ARCH)
    before = path.read_bytes()

    class Unserialisable:
        pass

    # The architecture fails to serialise after the temporary file was opened.
    with pytest.raises(TypeError):
        weights.write(path, {"w": np.zeros((3, 4), dtype=np.float32)}, {**ARCH, "kind": Unserialisable()})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert weights.load_architecture(path) == ARCH
