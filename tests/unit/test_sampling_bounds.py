"""The sampling fields' bounds, checked the same at the gateway and the decoder, and the
HTTP body's defaults from a checkpoint's generation_config."""

from __future__ import annotations

import pytest

from gateway.front import Rejected
from gateway.generation_defaults import SamplingDefaults, defaults_from_dict
from gateway.sampling_body import sampling_from_body
from tessera.sampling import MIN_REPETITION_PENALTY, check_sampling, check_token_ids
from tessera.v1 import common_pb2


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"repetition_penalty": 2.5}, "repetition_penalty"),
        ({"repetition_penalty": 1e-30}, "repetition_penalty"),  # would overflow to inf
        ({"repetition_penalty": float("nan")}, "repetition_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"logit_bias": {3: 101.0}}, "logit_bias"),
        ({"logit_bias": {i: 1.0 for i in range(301)}}, "logit_bias"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ],
)
def test_out_of_bounds_values_are_refused_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        check_sampling(common_pb2.SamplingParams(**fields))


def test_edge_values_pass_after_the_trip_through_float32():
    check_sampling(
        common_pb2.SamplingParams(
            presence_penalty=-2,
            frequency_penalty=2,
            repetition_penalty=MIN_REPETITION_PENALTY,
            min_p=1,
            logit_bias={3: -100.0, 4: 100.0},
            max_tokens=4,
            min_tokens=4,
        )
    )
    check_sampling(common_pb2.SamplingParams(repetition_penalty=0))  # unset


def test_token_ids_outside_the_vocabulary_are_refused():
    check_token_ids(common_pb2.SamplingParams(logit_bias={9: 1.0}, stop_token_ids=[9]), 10)
    with pytest.raises(ValueError, match="logit_bias names token 10"):
        check_token_ids(common_pb2.SamplingParams(logit_bias={10: 1.0}), 10)
    with pytest.raises(ValueError, match="stop_token_ids names token 12"):
        check_token_ids(common_pb2.SamplingParams(stop_token_ids=[12]), 10)


def test_defaults_fill_only_what_the_body_leaves_unset():
    defaults = SamplingDefaults(temperature=0.7, top_p=0.9, top_k=5, repetition_penalty=1.3)
    unset = sampling_from_body({}, defaults)
    assert (unset.temperature, unset.top_k) == (pytest.approx(0.7), 5)
    assert unset.top_p == pytest.approx(0.9) and unset.repetition_penalty == pytest.approx(1.3)
    given = sampling_from_body({"temperature": 0, "top_k": -1, "top_p": None}, defaults)
    assert (given.temperature, given.top_k, given.top_p) == (0, 0, pytest.approx(0.9))
    assert sampling_from_body({}).temperature == 0  # no defaults: greedy


def test_a_checkpoint_default_no_request_could_send_fails_the_start():
    assert defaults_from_dict({"top_k": -1, "temperature": 0.6}) == SamplingDefaults(0.6, top_k=0)
    with pytest.raises(ValueError, match=r"generation_config\.json: repetition_penalty"):
        defaults_from_dict({"repetition_penalty": 3.0})
    with pytest.raises(ValueError, match=r"generation_config\.json: temperature"):
        defaults_from_dict({"temperature": "hot"})


def test_logit_bias_keys_are_token_ids():
    assert dict(sampling_from_body({"logit_bias": {"7": 2, "8": -1.5}}).logit_bias) == {
        7: 2.0,
        8: -1.5,
    }
    for bias in ({"-1": 1}, {"7": True}, ["7"], {"99999999999": 1}):
        with pytest.raises(Rejected) as caught:
            sampling_from_body({"logit_bias": bias})
        assert caught.value.param == "logit_bias"
