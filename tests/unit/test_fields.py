"""The body-field registry: refused and unknown fields are 400s naming them; the fields
other issue-14 branches implement are accepted, so merging them adds parsing only."""

from __future__ import annotations

import pytest

from gateway import fields
from gateway.fields import check_fields
from gateway.front import Rejected
from gateway.logprobs import chat_logprobs, completion_logprobs
from tessera.v1 import common_pb2


def refused_param(body: object, endpoint: fields.EndpointFields) -> str | None:
    try:
        check_fields(body, endpoint)
    except Rejected as error:
        return error.param
    return None


@pytest.mark.parametrize("name", ["temprature", "bogus", *fields.CHAT_REFUSED])
def test_unknown_and_unimplemented_chat_fields_are_refused_by_name(name):
    assert refused_param({"messages": [], name: 1}, fields.CHAT) == name


@pytest.mark.parametrize("name", sorted(fields.SAMPLING_FIELDS | fields.TOOL_FIELDS))
def test_the_sampling_and_tool_fields_are_accepted(name):
    assert refused_param({name: None}, fields.CHAT) is None


@pytest.mark.parametrize(
    ("name", "fine", "refused"),
    [
        ("store", False, True),
        ("service_tier", "auto", "flex"),
        ("user", "u", 3),
        ("metadata", {"a": "b"}, {"a": 1}),
    ],
)
def test_no_ops_only_with_values_that_change_nothing(name, fine, refused):
    assert refused_param({name: fine}, fields.CHAT) is None
    assert refused_param({name: refused}, fields.CHAT) == name


def test_completions_refuse_suffix_and_chat_only_fields():
    assert refused_param({"prompt": "a", "suffix": "b"}, fields.COMPLETIONS) == "suffix"
    assert refused_param({"prompt": "a", "messages": []}, fields.COMPLETIONS) == "messages"
    assert refused_param([], fields.COMPLETIONS) == "body"


def _entry(token_id: int, logprob: float, tops: list[tuple[int, float]]):
    top = [common_pb2.TopLogprob(token_id=t, logprob=p) for t, p in tops]
    return common_pb2.TokenLogprobs(token_id=token_id, logprob=logprob, top=top)


def test_logprob_shapes():
    entries = [_entry(1, -0.5, [(1, -0.5), (2, -1.5)]), _entry(2, -0.25, [(2, -0.25)])]
    text = {1: "é", 2: "b"}.__getitem__
    chat = chat_logprobs(entries, 1, text)["content"]
    assert chat[0] == {
        "token": "é",
        "logprob": -0.5,
        "bytes": [0xC3, 0xA9],
        "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [0xC3, 0xA9]}],
    }
    legacy = completion_logprobs(entries, 2, text, offset=3)
    assert legacy["tokens"] == ["é", "b"] and legacy["text_offset"] == [3, 4]
    assert legacy["top_logprobs"] == [{"é": -0.5, "b": -1.5}, {"b": -0.25}]
