from tessera.loop_guard import error_backoff_seconds


def test_errors_in_a_row_pause_a_loop_longer_up_to_a_second():
    pauses = [error_backoff_seconds(n) for n in range(1, 13)]
    assert pauses[:3] == [0.002, 0.004, 0.008]
    assert pauses[8] == 0.512 and pauses[9:] == [1.0, 1.0, 1.0]
    assert error_backoff_seconds(10**6) == 1.0  # no overflow however long it goes on
