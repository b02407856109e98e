"""Log formats (tessera.logs), the access log line and the stats line's formatting."""

from __future__ import annotations

import argparse
import json
import logging

import grpc
import pytest

from decoder_service.config import DecoderConfig, add_decoder_flags
from encoder_service.config import EncoderConfig, add_encoder_flags
from gateway.access_log import AccessRecord, log_access, status_text
from gateway.config import GatewayConfig, add_gateway_flags
from gateway.stats_log import Snapshot, stats_line
from tessera.launcher import route_flags
from tessera.logs import JsonFormatter, TextFormatter, configure_logging, formatter_for
from tessera.v1 import decoder_pb2


def record(message: str = "hello %s", args=("world",), fields=None) -> logging.LogRecord:
    entry = logging.LogRecord("tessera.test", logging.WARNING, __file__, 1, message, args, None)
    if fields is not None:
        entry.fields = fields
    return entry


def test_a_json_line_has_the_fixed_keys_and_the_fields_as_keys():
    line = JsonFormatter().format(record(fields={"request_id": "r1", "prompt_tokens": 7}))
    entry = json.loads(line)
    assert entry["level"] == "WARNING" and entry["logger"] == "tessera.test"
    assert entry["message"] == "hello world"
    assert entry["request_id"] == "r1" and entry["prompt_tokens"] == 7
    assert entry["ts"].endswith("+00:00")


def test_a_field_never_overrides_a_fixed_key_and_odd_values_still_log():
    line = JsonFormatter().format(record(fields={"message": "forged", "path": object}))
    entry = json.loads(line)
    assert entry["message"] == "hello world"
    assert "object" in entry["path"]


def test_a_json_line_carries_the_exception_on_the_same_line():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        entry = record()
        entry.exc_info = sys.exc_info()
    line = JsonFormatter().format(entry)
    assert "\n" not in line
    assert "ValueError: boom" in json.loads(line)["exception"]


def test_a_text_line_appends_the_fields():
    line = TextFormatter().format(record(fields={"request_id": "r1", "status": "200"}))
    assert line.endswith("WARNING tessera.test: hello world request_id=r1 status=200")


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="xml"):
        formatter_for("xml")


SERVICES = {
    "gateway": (add_gateway_flags, GatewayConfig, ["--encoders", "a:1", "--decoders", "b:2"]),
    "decoder": (add_decoder_flags, DecoderConfig, []),
    "encoder": (add_encoder_flags, EncoderConfig, []),
}


def parser_of(service: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    SERVICES[service][0](parser)
    return parser


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_every_service_takes_log_format_into_its_config(service, monkeypatch):
    _, config_class, required = SERVICES[service]
    args = parser_of(service).parse_args(["--model", "m", "--log-format", "json", *required])
    assert config_class.from_args(args).log_format == "json"
    monkeypatch.setenv("TESSERA_LOG_FORMAT", "json")
    assert parser_of(service).parse_args(["--model", "m", *required]).log_format == "json"
    monkeypatch.setenv("TESSERA_LOG_FORMAT", "yaml")
    with pytest.raises(SystemExit, match="TESSERA_LOG_FORMAT"):
        parser_of(service)


def test_tessera_serve_gives_log_format_to_every_service():
    parsers = {name: parser_of(name) for name in SERVICES}
    routed = route_flags(["--log-format", "json"], parsers)
    assert routed == {name: ["--log-format", "json"] for name in SERVICES}


def test_the_access_line_carries_every_field(caplog):
    caplog.set_level(logging.INFO, logger="tessera.gateway.access")
    log_access(
        AccessRecord(
            "r1",
            "http",
            "demo",
            status_text("http", grpc.StatusCode.INVALID_ARGUMENT),
            prompt_tokens=12,
            output_tokens=3,
            media_items=2,
            media_items_cached=1,
            ttft_seconds=0.123456,
            total_seconds=0.5,
            finish_reason="length",
        )
    )
    (entry,) = caplog.records
    assert entry.fields["status"] == "400" and entry.fields["ttft_seconds"] == 0.1235
    assert entry.fields["media_items_cached"] == 1 and entry.fields["finish_reason"] == "length"
    assert status_text("grpc", grpc.StatusCode.INVALID_ARGUMENT) == "INVALID_ARGUMENT"
    assert status_text("http", grpc.StatusCode.CANCELLED) == "499"


def test_the_stats_line_reports_rates_over_the_interval():
    before = Snapshot(at=0.0, requests=5, prompt_tokens=1000, generation_tokens=50)
    now = Snapshot(
        at=10.0,
        requests=7,
        prompt_tokens=1200,
        cached_prompt_tokens=50,
        generation_tokens=150,
        memory_queries=4,
        memory_hits=1,
        redis_queries=3,
        redis_hits=3,
    )
    decoders = [
        decoder_pb2.DecoderStats(
            num_running=2, num_waiting=1, num_kv_blocks=8, num_free_kv_blocks=6
        ),
        decoder_pb2.DecoderStats(num_running=1, num_kv_blocks=8, num_free_kv_blocks=8),
    ]
    assert stats_line(before, now, decoders) == (
        "Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 10.0 tokens/s, "
        "Running: 3 reqs, Waiting: 1 reqs, KV cache usage: 12.5%, "
        "Prefix cache hit rate: 25.0%, Encoder cache hit rate: 100.0% "
        "(memory 25.0%, redis 100.0%)"
    )


def test_an_idle_interval_logs_nothing_but_running_requests_do():
    idle = Snapshot(at=0.0, requests=3)
    later = Snapshot(at=10.0, requests=3)
    assert stats_line(idle, later, []) is None
    line = stats_line(idle, Snapshot(at=10.0, requests=3, running=1), [])
    assert line is not None and "Running: 1 reqs" in line


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    from transformers.utils import logging as transformers_logging

    logging.captureWarnings(False)
    root.handlers[:] = handlers
    root.setLevel(level)
    transformers_logging.enable_default_handler()
    transformers_logging.disable_propagation()
    transformers_logging.enable_progress_bar()


def test_with_json_every_line_parses_warnings_and_transformers_included(capsys, restore_logging):
    import warnings

    from transformers.utils import logging as transformers_logging

    configure_logging("INFO", "json")
    logging.getLogger("tessera.test").info("ready", extra={"fields": {"port": 1}})
    warnings.warn("something odd", UserWarning, stacklevel=1)
    transformers_logging.get_logger("transformers.test").warning("from transformers")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["logger"] for line in lines] == [
        "tessera.test",
        "py.warnings",
        "transformers.test",
    ]
    assert lines[0]["port"] == 1 and "something odd" in lines[1]["message"]
