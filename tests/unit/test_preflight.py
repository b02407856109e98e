"""tessera.preflight: each service's first mistake, in one line naming the service and the
flag, found without starting anything."""

from __future__ import annotations

import itertools
import json
import socket

import pytest

from decoder_service.main import build_parser as decoder_parser
from encoder_service.main import build_parser as encoder_parser
from gateway.main import build_parser as gateway_parser
from tessera.launcher import plan_replicas
from tessera.preflight import (
    Problem,
    check_serve,
    check_service,
    model_problem,
    ports_in_use,
    service_parser,
)

ROUTES = {"decoder": ["--encoders", "e:1"], "gateway": ["--encoders", "e:1", "--decoders", "d:1"]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A directory that passes as a checkpoint (config.json of a supported architecture)."""
    directory = tmp_path_factory.mktemp("model")
    config = {"architectures": ["LlavaForConditionalGeneration"]}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def check(service: str, model_dir, *flags: str) -> Problem | None:
    return check_service(service, ["--model", str(model_dir), *ROUTES.get(service, []), *flags])


def test_good_flags_pass(model_dir):
    for service in ("encoder", "decoder", "gateway"):
        assert check(service, model_dir) is None


@pytest.mark.parametrize(
    ("service", "flags", "line"),
    [
        (
            "decoder",
            ["--kv-cache-memory-fraction", "1.5"],
            "decoder: --kv-cache-memory-fraction must be in [0, 1) (0: size by "
            "--kv-cache-bytes), got 1.5",
        ),
        ("decoder", ["--max-num-seqs", "0"], "decoder: --max-num-seqs must be >= 1, got 0"),
        (
            "decoder",
            ["--decode-kv-mirror-bytes", "-1"],
            "decoder: --decode-kv-mirror-bytes must be >= 0, got -1",
        ),
        ("encoder", ["--cache-bytes", "-5"], "encoder: --cache-bytes must be >= 0, got -5"),
        (
            "gateway",
            ["--request-timeout-seconds", "0"],
            "gateway: --request-timeout-seconds must be > 0, got 0",
        ),
        ("gateway", ["--http-port", "70000"], "gateway: --http-port: must be in 0..65535"),
        ("decoder", ["--dtype", "int4"], "decoder: --dtype: 'int4' is not a dtype"),
        ("gateway", ["--no-such-flag"], "gateway: unrecognized arguments: --no-such-flag"),
        ("gateway", ["--api-key-file", "/no/keys"], "gateway: --api-key-file /no/keys does not"),
        ("encoder", ["--tls-cert-file", "/no/c.pem"], "encoder: --tls-cert-file /no/c.pem"),
        ("decoder", ["--device", "cuda:7"], "decoder: --device cuda:7: this machine has"),
        ("decoder", ["--device", "toaster"], "decoder: --device toaster is not a torch device"),
        ("gateway", ["--log-level", "loud"], "gateway: --log-level: 'loud' is not a log level"),
    ],
)
def test_each_mistake_is_one_line_naming_service_and_flag(model_dir, service, flags, line):
    problem = check(service, model_dir, *flags)
    assert problem is not None and problem.line().startswith(line), problem
    assert "\n" not in problem.line()


def test_tls_files_that_do_not_fit(model_dir, tmp_path):
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    problem = check(
        "encoder",
        model_dir,
        *["--tls-cert-file", str(tmp_path / "c.pem"), "--tls-key-file", str(tmp_path / "k.pem")],
    )
    assert problem is not None and "the TLS files" in problem.message


def test_redis_secrets_are_read_before_start(model_dir, tmp_path):
    (tmp_path / "short.key").write_text("too short")
    flags = ["--redis-url", "redis://127.0.0.1:6379/0"]
    problem = check(
        "encoder", model_dir, *flags, "--cache-mac-key-file", str(tmp_path / "short.key")
    )
    assert problem is not None and problem.service == "encoder", problem
    assert "32" in problem.message  # the key's least length


def test_model_paths_and_hub_ids(model_dir, tmp_path):
    assert model_problem(str(model_dir)) is None
    assert model_problem("Qwen/Qwen2.5-VL-7B-Instruct") is None
    assert "does not exist" in model_problem(str(tmp_path / "nope"))
    assert "has no config.json" in model_problem(str(tmp_path))
    (tmp_path / "f").write_text("")
    assert "is not a directory" in model_problem(str(tmp_path / "f"))
    assert "neither a directory nor a hub id" in model_problem("not//a hub id")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"architectures": ["BertModel"]}')
    assert "architecture BertModel is not supported" in model_problem(str(tmp_path / "bert"))


def test_the_preflight_parsers_take_exactly_the_services_flags():
    """serve routes and checks with parsers built from the config modules: they must be
    the services' own."""
    for service, build in [
        ("encoder", encoder_parser),
        ("decoder", decoder_parser),
        ("gateway", gateway_parser),
    ]:
        own = set(build()._option_string_actions) - {"-h", "--help"}
        assert set(service_parser(service)._option_string_actions) == own, service


def plan(model: str, routed: dict[str, list[str]], port: int = 50051):
    full = {"encoder": [], "decoder": [], "gateway": [], **routed}
    return plan_replicas(model, "127.0.0.1", port, full, 2, 1, ports=itertools.repeat(0))


def test_serve_reports_one_line_per_bad_service(model_dir):
    routed = {"decoder": ["--max-num-seqs", "0", "--max-chunk-tokens", "0"]}
    problems = check_serve(plan(str(model_dir), routed), "127.0.0.1", {"--port": 0})
    assert [p.line() for p in problems] == ["decoder: --max-num-seqs must be >= 1, got 0"]
    everyone = check_serve(plan("/no/model", {}), "127.0.0.1", {"--port": 0})
    assert [p.service for p in everyone] == ["encoder", "decoder", "gateway"]
    assert check_serve(plan("/no/model", {}), "127.0.0.1", {}, check_model=False) == []


def test_serve_refuses_a_taken_or_repeated_gateway_port(model_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert ports_in_use("127.0.0.1", {"--port": port})[0].startswith(f"--port {port} is in use")
        problems = check_serve(plan(str(model_dir), {}, port), "127.0.0.1", {"--port": port})
        assert [p.service for p in problems] == ["gateway"]
    repeated = check_serve(
        plan(str(model_dir), {}), "127.0.0.1", {"--port": 50999, "--http-port": 50999}
    )
    assert repeated[0].line().startswith("gateway: --port and --http-port must differ")


@pytest.mark.parametrize(
    ("service", "flags", "line"),
    [
        ("encoder", ["--max-batch-items", "0"], "--max-batch-items must be >= 1, got 0"),
        ("decoder", ["--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
    ],
)
def test_a_service_started_on_its_own_gets_the_bound_checks_serve_makes(
    model_dir, service, flags, line, capsys
):
    from tessera.cli import main

    with pytest.raises(SystemExit) as stopped:
        main([service, "--model", str(model_dir), *ROUTES.get(service, []), *flags])
    assert stopped.value.code == 2  # refused before loading anything
    assert capsys.readouterr().err.strip() == f"tessera {service}: {line}"
