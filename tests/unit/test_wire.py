"""The switch's per-pair timing: delay, no reordering, a link busy at its rate, loss."""

from __future__ import annotations

import random

import pytest

from tessera.testbed.wire import PairState


def test_delay_holds_each_frame_and_never_reorders():
    pair = PairState(delay_s=0.010, jitter_s=0.008)
    rng = random.Random(1)
    releases = [pair.release_time(now / 1000, 100, rng) for now in range(50)]
    assert all(release >= now / 1000 + 0.002 for now, release in enumerate(releases))
    assert releases == sorted(releases), "a later frame never leaves before an earlier one"


def test_a_rate_limit_keeps_the_link_busy_for_each_frame():
    pair = PairState(bits_per_s=8e6)  # 1 MB/s: a 1000-byte frame occupies 1 ms
    rng = random.Random(0)
    releases = [pair.release_time(0.0, 1000, rng) for _ in range(3)]
    assert releases == pytest.approx([0.001, 0.002, 0.003])
    assert pair.release_time(1.0, 1000, rng) == pytest.approx(1.001), "idle link: no backlog"


@pytest.mark.parametrize(("loss", "num_lost"), [(0.0, 0), (1.0, 100)])
def test_loss_drops_that_share(loss: float, num_lost: int):
    pair = PairState(loss=loss)
    rng = random.Random(0)
    lost = [pair.release_time(0.0, 100, rng) is None for _ in range(100)]
    assert sum(lost) == num_lost


def test_an_unshaped_pair_is_passed_straight_through():
    assert not PairState().shaped
    assert PairState(loss=0.01).shaped and PairState(delay_s=0.001).shaped
