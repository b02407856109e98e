"""What `tessera serve --encoders N --decoders M [--redis-url URL]` starts, without
starting it: the same flags the Kubernetes manifests give each service."""

from __future__ import annotations

import itertools

import pytest

from tessera.cli import build_parser
from tessera.launcher import plan_replicas, route_flags

ROUTED = {"encoder": [], "decoder": [], "gateway": []}


def plan(routed=ROUTED, cpus=4, **kwargs):
    ports = itertools.count(41000)
    return plan_replicas("m", "127.0.0.1", 50051, routed, ports=ports, cpus=cpus, **kwargs)


def test_default_is_one_of_each_with_the_old_arguments():
    replicas = plan()
    assert [(r.name, r.service) for r in replicas] == [
        ("encoder", "encoder"),
        ("decoder", "decoder"),
        ("gateway", "gateway"),
    ]
    encoder, decoder, gateway = replicas
    common = ["--model", "m", "--host", "127.0.0.1"]
    assert encoder.args == [
        *common,
        "--port",
        "41000",
        "--torch-threads",
        "2",
        "--expedite-torch-threads",
        "4",
    ]
    assert decoder.args == [
        *common,
        "--port",
        "41001",
        "--torch-threads",
        "4",
        "--encoders",
        "127.0.0.1:41000",
    ]
    assert gateway.args == [
        *common,
        "--port",
        "50051",
        "--torch-threads",
        "2",
        "--encoders",
        "127.0.0.1:41000",
        "--decoders",
        "127.0.0.1:41001",
    ]


def test_replicas_share_redis_and_decoders_and_the_gateway_get_every_address():
    replicas = plan(encoders=3, decoders=2, redis_url="redis://127.0.0.1:6400/0")
    encoders = [r for r in replicas if r.service == "encoder"]
    decoders = [r for r in replicas if r.service == "decoder"]
    (gateway,) = [r for r in replicas if r.service == "gateway"]
    assert [r.name for r in encoders] == ["encoder-0", "encoder-1", "encoder-2"]
    assert [r.name for r in decoders] == ["decoder-0", "decoder-1"]
    assert len({r.address for r in replicas}) == len(replicas) == 6
    for encoder in encoders:
        assert encoder.args[-2:] == ["--redis-url", "redis://127.0.0.1:6400/0"]
    encoder_list = ",".join(r.address for r in encoders)
    for decoder in decoders:
        assert "--redis-url" not in decoder.args
        # Each decoder dials only the encoders it is given: all of them.
        assert decoder.args[decoder.args.index("--encoders") + 1] == encoder_list
    index = gateway.args.index("--encoders")
    assert gateway.args[index + 1] == ",".join(r.address for r in encoders)
    index = gateway.args.index("--decoders")
    assert gateway.args[index + 1] == ",".join(r.address for r in decoders)


def test_colocated_runs_the_encoder_in_each_decoder_and_no_encoder_service():
    from decoder_service.main import build_parser as decoder_parser
    from gateway.main import build_parser as gateway_parser

    replicas = plan(decoders=2, colocated=True)
    assert [r.service for r in replicas] == ["decoder", "decoder", "gateway"]
    for decoder in replicas[:2]:
        assert decoder_parser().parse_args(decoder.args).colocated_encoder
        assert "--encoders" not in decoder.args
    gateway = gateway_parser().parse_args(replicas[-1].args)
    assert not gateway.encoders, "no Encode calls: the decoders encode"
    assert len(gateway.decoders) == 2
    with pytest.raises(SystemExit, match="Redis"):
        plan(colocated=True, redis_url="redis://127.0.0.1:6379/0")


def torch_threads(replica, flag: str = "--torch-threads") -> int:
    (index,) = [i for i, arg in enumerate(replica.args) if arg == flag]
    return int(replica.args[index + 1])


@pytest.mark.parametrize(
    ("cpus", "encoders", "decoders", "expected"),
    [
        # On 2 CPUs the encoder and the gateway get one thread, the decoder both.
        (2, 1, 1, {"encoder": 1, "decoder": 2, "gateway": 1}),
        (8, 1, 1, {"encoder": 4, "decoder": 8, "gateway": 4}),
        # Replicas of a service share its part of the host.
        (8, 2, 2, {"encoder-0": 2, "encoder-1": 2, "decoder-0": 4, "gateway": 4}),
        # Never fewer than one thread.
        (1, 3, 2, {"encoder-2": 1, "decoder-1": 1, "gateway": 1}),
    ],
)
def test_services_on_one_host_split_its_cpus(cpus, encoders, decoders, expected):
    replicas = {r.name: r for r in plan(cpus=cpus, encoders=encoders, decoders=decoders)}
    assert {name: torch_threads(replicas[name]) for name in expected} == expected


@pytest.mark.parametrize(
    ("cpus", "encoders", "expected"),
    [
        (2, 1, 2),  # a decoder idling for the encoder's items leaves it the host
        (8, 3, 2),  # ... split between the encoders
        (1, 2, 1),
    ],
)
def test_encoders_widen_to_their_split_of_the_host_while_a_decoder_idles(cpus, encoders, expected):
    replicas = plan(cpus=cpus, encoders=encoders)
    widths = [
        torch_threads(r, "--expedite-torch-threads") for r in replicas if r.service == "encoder"
    ]
    assert widths == [expected] * encoders
    assert all("--expedite-torch-threads" not in r.args for r in replicas if r.service != "encoder")


def test_colocated_decoder_keeps_every_cpu():
    replicas = plan(cpus=2, decoders=1, colocated=True)
    assert [torch_threads(r) for r in replicas] == [2, 1]


def test_torch_threads_given_to_serve_win_over_the_split():
    from decoder_service.main import build_parser as decoder_parser

    parsers = {"decoder": decoder_parser()}
    for given in (["--torch-threads", "3"], ["--torch-threads=3"]):
        routed = {**ROUTED, **route_flags(given, parsers)}
        decoder = next(r for r in plan(routed=routed, cpus=2) if r.service == "decoder")
        assert decoder_parser().parse_args(decoder.args).torch_threads == 3
        assert sum(arg.startswith("--torch-threads") for arg in decoder.args) == 1


def test_expedite_threads_given_to_serve_win_over_the_split():
    from encoder_service.main import build_parser as encoder_parser

    routed = {
        **ROUTED,
        **route_flags(["--expedite-torch-threads=1"], {"encoder": encoder_parser()}),
    }
    encoder = next(r for r in plan(routed=routed, cpus=2) if r.service == "encoder")
    assert encoder_parser().parse_args(encoder.args).expedite_torch_threads == 1
    assert sum(arg.startswith("--expedite-torch-threads") for arg in encoder.args) == 1


def test_serve_refuses_colocated_with_encoder_replicas(capsys):
    from tessera.cli import main

    with pytest.raises(SystemExit, match="drop --encoders"):
        main(["serve", "--colocated", "--encoders", "2"])


def test_each_replica_gets_its_own_metrics_port_when_the_service_has_the_flag():
    replicas = plan(encoders=2, with_metrics={"encoder", "decoder"})
    metrics = [r.metrics_port for r in replicas]
    assert metrics[2] is not None and metrics[-1] is None  # the gateway lacks it here
    taken = [int(r.address.rsplit(":", 1)[1]) for r in replicas] + [
        m for m in metrics if m is not None
    ]
    assert len(taken) == len(set(taken))
    for replica in replicas:
        if replica.metrics_port is not None:
            index = replica.args.index("--metrics-port")
            assert replica.args[index + 1] == str(replica.metrics_port)


def test_every_planned_command_line_parses_in_its_service():
    from decoder_service.main import build_parser as decoder_parser
    from encoder_service.main import build_parser as encoder_parser
    from gateway.main import build_parser as gateway_parser

    parsers = {
        "encoder": encoder_parser(),
        "decoder": decoder_parser(),
        "gateway": gateway_parser(),
    }
    routed = route_flags(["--max-chunk-tokens", "16", "--device=cpu"], parsers)
    with_metrics = {n for n, p in parsers.items() if "--metrics-port" in p._option_string_actions}
    replicas = plan_replicas(
        "m",
        "127.0.0.1",
        50051,
        routed,
        encoders=2,
        decoders=2,
        redis_url="redis://127.0.0.1:6379/0",
        with_metrics=with_metrics,
        ports=itertools.count(42000),
    )
    for replica in replicas:
        parsed = parsers[replica.service].parse_args(replica.args)
        assert f"{parsed.host}:{parsed.port}" == replica.address
    gateway = parsers["gateway"].parse_args(replicas[-1].args)
    assert len(gateway.encoders) == 2 and len(gateway.decoders) == 2
    for replica in replicas:
        if replica.service == "decoder":
            decoder = parsers["decoder"].parse_args(replica.args)
            assert decoder.encoders == gateway.encoders


def test_serve_options():
    args, extra = build_parser().parse_known_args(
        ["serve", "--encoders", "3", "--decoders", "2", "--redis-url", "redis://h:1/0"]
    )
    assert (args.encoders, args.decoders, args.redis_url, extra) == (3, 2, "redis://h:1/0", [])
    args, _ = build_parser().parse_known_args(["serve"])
    assert (args.encoders, args.decoders, args.redis_url) == (1, 1, None)
    with pytest.raises(SystemExit):
        build_parser().parse_known_args(["serve", "--encoders", "0"])


def test_metrics_port_is_set_by_serve_itself():
    with pytest.raises(SystemExit, match="sets --metrics-port itself"):
        route_flags(["--metrics-port", "9100"], {"encoder": build_parser()})


def test_tls_auto_gives_each_service_its_own_role_certificate(tmp_path):
    from encoder_service.config import EncoderConfig
    from encoder_service.main import build_parser as encoder_parser
    from tessera.certs import write_role_certificates

    files = write_role_certificates(tmp_path)
    replicas = plan(encoders=2, tls=files)
    for replica in replicas:
        index = replica.args.index("--tls-cert-file")
        assert replica.args[index : index + 6] == [
            "--tls-cert-file",
            str(tmp_path / f"{replica.service}.pem"),
            "--tls-key-file",
            str(tmp_path / f"{replica.service}.key"),
            "--tls-ca-file",
            str(tmp_path / "ca.pem"),
        ]
    config = EncoderConfig.from_args(encoder_parser().parse_args(replicas[0].args))
    assert config.tls == files["encoder"] and config.tls.mutual
    args, _ = build_parser().parse_known_args(["serve", "--tls", "auto"])
    assert args.tls == "auto"


def test_serve_refuses_tls_files_and_caller_rules_it_cannot_route():
    parsers = {"encoder": build_parser()}
    with pytest.raises(SystemExit, match="its own --tls-cert-file: use --tls auto"):
        route_flags(["--tls-cert-file", "x.pem"], parsers)
    with pytest.raises(SystemExit, match="cannot route --allow-callers"):
        route_flags(["--allow-callers", "Encode=gateway"], parsers)
