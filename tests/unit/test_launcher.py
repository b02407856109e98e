"""`tessera serve` passes each extra flag to every service whose parser takes it."""

from __future__ import annotations

import pytest

from tessera.launcher import example_media, route_flags


@pytest.fixture(scope="module")
def parsers():
    from decoder_service.main import build_parser as decoder_parser
    from encoder_service.main import build_parser as encoder_parser
    from gateway.main import build_parser as gateway_parser

    return {"encoder": encoder_parser(), "decoder": decoder_parser(), "gateway": gateway_parser()}


def test_nothing_to_route(parsers):
    assert route_flags([], parsers) == {"encoder": [], "decoder": [], "gateway": []}


def test_decoder_only_flag_with_separate_value(parsers):
    routed = route_flags(["--max-chunk-tokens", "16"], parsers)
    assert routed == {"encoder": [], "decoder": ["--max-chunk-tokens", "16"], "gateway": []}


def test_encoder_only_flag(parsers):
    routed = route_flags(["--cache-bytes", "5"], parsers)
    assert routed == {"encoder": ["--cache-bytes", "5"], "decoder": [], "gateway": []}


def test_shared_flag_with_equals_goes_to_every_service_that_takes_it(parsers):
    routed = route_flags(["--device=cpu"], parsers)
    assert routed["encoder"] == ["--device=cpu"]
    assert routed["decoder"] == ["--device=cpu"]
    for name, parser in parsers.items():
        takes_it = "--device" in parser._option_string_actions
        assert (routed[name] == ["--device=cpu"]) == takes_it


def test_flag_shared_by_encoder_and_gateway(parsers):
    routed = route_flags(["--max-image-pixels", "1000"], parsers)
    assert routed["encoder"] == routed["gateway"] == ["--max-image-pixels", "1000"]
    assert routed["decoder"] == []


def test_several_flags_keep_their_values(parsers):
    extra = ["--max-chunk-tokens", "16", "--device=cpu", "--cache-bytes", "5", "--lease-ms=10"]
    routed = route_flags(extra, parsers)
    assert routed["encoder"] == ["--device=cpu", "--cache-bytes", "5"]
    assert routed["decoder"] == ["--max-chunk-tokens", "16", "--device=cpu", "--lease-ms=10"]
    assert "--cache-bytes" not in routed["gateway"]
    assert "--max-chunk-tokens" not in routed["gateway"]


def test_routed_flags_parse_in_each_service(parsers):
    extra = ["--max-chunk-tokens", "16", "--device=cpu", "--cache-bytes", "5"]
    routed = route_flags(extra, parsers)
    encoder = parsers["encoder"].parse_args(["--model", "m", *routed["encoder"]])
    decoder = parsers["decoder"].parse_args(["--model", "m", *routed["decoder"]])
    assert (encoder.cache_bytes, encoder.device) == (5, "cpu")
    assert (decoder.max_chunk_tokens, decoder.device) == (16, "cpu")


def test_unknown_flag_refused(parsers):
    with pytest.raises(SystemExit, match="no service takes --no-such-flag"):
        route_flags(["--no-such-flag", "1"], parsers)


def test_stray_value_refused(parsers):
    with pytest.raises(SystemExit, match="no service takes"):
        route_flags(["16"], parsers)


@pytest.mark.parametrize("extra", [["--model", "x"], ["--model=x"], ["--port", "1"]])
def test_flags_serve_sets_itself_refused(parsers, extra):
    with pytest.raises(SystemExit, match=r"sets --(model|port) itself"):
        route_flags(extra, parsers)


def test_max_audio_seconds_goes_to_the_gateway_and_encoder(parsers):
    routed = route_flags(["--max-audio-seconds", "120"], parsers)
    assert routed == {
        "encoder": ["--max-audio-seconds", "120"],
        "decoder": [],
        "gateway": ["--max-audio-seconds", "120"],
    }


def test_the_example_request_matches_the_model_media(tmp_path):
    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "config.json").write_text('{"audio_config": {}}')
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "config.json").write_text('{"vision_config": {}}')
    assert example_media(str(tmp_path / "audio")).startswith("--audio ")
    assert example_media(str(tmp_path / "image")).startswith("--image ")
    assert example_media("some/hub-id").startswith("--image ")
