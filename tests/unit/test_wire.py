import numpy as np

from serve_app.engine.wire import PositionLogprobs


def test_from_flat_keeps_positions_and_entries():
    flat = PositionLogprobs.from_flat([0, 0, 3], [0, 3, 5], [7, 1, 7, 2, 9], [-1.5, -0.1, -1.5, -2.0, -3.0],
                                      [2, 1, 2, 1, 2])
    assert len(flat) == 3
    assert not flat.is_scored(0) and flat.is_scored(1)
    assert flat.actual(1) == (7, -1.5, 2)
    ids, logprobs, ranks = flat.top(1, 5)
    assert ids.tolist() == [1, 7] and ranks.tolist() == [1, 2]
    assert flat.top(2, 0)[0].tolist() == []
    assert flat.token_ids.dtype == np.int32 and flat.logprobs.dtype == np.float32


def test_from_flat_of_nothing():
    assert len(PositionLogprobs.from_flat([], [], [], [], [])) == 0
