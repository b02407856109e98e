"""The `tessera` command."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from tessera import __version__
from tessera.config_common import env_default
from tessera.demo_models import DEFAULT_FAMILY, DEMO_FAMILIES, DEMO_MODEL_SIZES
from tessera.server_errors import PortTakenError, StartupError, one_line
from tessera.startup_flags import HelpFormatter, is_debug, port_number
from tessera.tls import TlsFiles, TlsFilesError, add_tls_flags


def default_demo_dir(family: str = DEFAULT_FAMILY) -> Path:
    home = env_default("TESSERA_HOME", str(Path.home() / ".cache" / "tessera"))
    return Path(home) / ("demo-tiny" if family == DEFAULT_FAMILY else f"demo-{family}-tiny")


def ensure_demo_model(directory: Path, family: str = DEFAULT_FAMILY) -> Path:
    if (directory / "config.json").exists():
        return directory
    from tessera.demo_models import make_demo_model

    print(f"making the demo model ({family}) in {directory} (first run only)", flush=True)
    return make_demo_model(
        directory,
        family=family,
        seed=0,
        size="tiny",
        progress=lambda line: print(f"  {line}", flush=True),
    )


def cmd_serve(args: argparse.Namespace, extra: list[str]) -> None:
    from tessera.launcher import metrics_services, plan_replicas, route_flags, serve_all
    from tessera.preflight import check_serve, service_parsers

    parsers = service_parsers()
    try:
        routed = route_flags(extra, parsers)
    except SystemExit as error:  # a flag no service takes: a usage error, as argparse's
        print(f"tessera serve: {error.code}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.max_chunk_tokens is not None:
        routed["decoder"] += ["--max-chunk-tokens", str(args.max_chunk_tokens)]
    if args.http_port:
        routed["gateway"] += ["--http-port", str(args.http_port)]
    if args.model and args.family:
        raise SystemExit("tessera serve: give --model or --family, not both")
    if args.colocated and args.encoders > 1:
        raise SystemExit("tessera serve: --colocated runs no encoder service; drop --encoders")
    family = args.family or DEFAULT_FAMILY
    model = args.model or str(default_demo_dir(family))
    # Every flag of every service, before anything starts (the demo model is made after:
    # a typo should not wait for it).
    plan = plan_replicas(
        model,
        args.host,
        args.port,
        routed,
        args.encoders,
        args.decoders,
        args.redis_url,
        ports=itertools.repeat(0),
        colocated=args.colocated,
    )
    gateway_ports = {"--port": args.port, "--http-port": args.http_port}
    problems = check_serve(plan, args.host, gateway_ports, check_model=args.model is not None)
    if problems:
        print("\n".join(problem.line() for problem in problems), file=sys.stderr)
        raise SystemExit(2)
    if not args.model:
        ensure_demo_model(Path(model), family)
    serve_all(
        model,
        args.host,
        args.port,
        routed,
        args.ready_timeout,
        encoders=args.encoders,
        decoders=args.decoders,
        redis_url=args.redis_url,
        with_metrics=metrics_services(parsers),
        http_port=args.http_port,
        auto_tls=args.tls == "auto",
        colocated=args.colocated,
    )


def replica_count(value: str) -> int:
    count = int(value)
    if count < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return count


def cmd_generate(args: argparse.Namespace) -> None:
    from tessera.client import Audio, Client, Message, SamplingParams, TesseraError, Video

    try:
        parts: list[str | bytes | Audio | Video] = [Path(p).read_bytes() for p in args.image]
        parts += [Audio(Path(p).read_bytes()) for p in args.audio]
        parts += [Video(Path(p).read_bytes()) for p in args.video]
    except OSError as error:
        raise SystemExit(f"tessera generate: cannot read media: {error}") from None
    parts.append(args.prompt)
    sampling = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    options = {"mm_processor_kwargs": args.mm_processor_kwargs or {}}
    try:
        with Client(args.server, tls=TlsFiles.from_args(args), api_key=args.api_key) as client:
            if not args.json:
                for delta in client.deltas([Message("user", parts)], sampling, **options):
                    print(delta.text, end="", flush=True)
                print()
                return
            completion = client.complete([Message("user", parts)], sampling, **options)
    except TesseraError as error:
        raise SystemExit(f"tessera generate: {error.code().name}: {error.details()}") from None
    except TlsFilesError as error:
        raise SystemExit(f"tessera generate: {error}") from None
    from google.protobuf.json_format import MessageToDict

    print(
        json.dumps(
            {
                "text": completion.text,
                "token_ids": completion.token_ids,
                "prompt_token_ids": completion.prompt_token_ids,
                "finish_reason": completion.finish_reason,
                "usage": completion.usage,
                "stats": MessageToDict(completion.stats, preserving_proto_field_name=True),
            }
        )
    )


def cmd_make_demo_model(args: argparse.Namespace) -> None:
    from tessera.demo_models import make_demo_model

    make_demo_model(
        Path(args.dir), family=args.family, seed=args.seed, size=args.size, progress=print
    )


SERVICE_COMMANDS = {
    "encoder": "run one encoder replica",
    "decoder": "run one decoder replica",
    "gateway": "run the gateway",
}


def add_service_flags(name: str, parser: argparse.ArgumentParser) -> None:
    """The service's own flags, from its config module (what its main's build_parser
    adds), which imports no torch."""
    if name == "encoder":
        from encoder_service.config import add_encoder_flags as add_flags
    elif name == "decoder":
        from decoder_service.config import add_decoder_flags as add_flags
    else:
        from gateway.config import add_gateway_flags as add_flags
    add_flags(parser)


def build_parser(with_services: bool = True) -> argparse.ArgumentParser:
    """The whole command line. Without `with_services` the three service commands are
    listed but take no flags, so the client commands start without torch."""
    parser = argparse.ArgumentParser(
        prog="tessera", description="Tessera multimodal LLM serving", formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"tessera {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in SERVICE_COMMANDS.items():
        service = commands.add_parser(
            name, help=text, description=text, formatter_class=HelpFormatter
        )
        if with_services:
            add_service_flags(name, service)

    serve = commands.add_parser(
        "serve",
        formatter_class=HelpFormatter,
        help="run gateway, encoders and decoders on localhost",
        description="Runs the whole system (one encoder and one decoder, or --encoders N "
        "--decoders M replicas); any other service flag is passed to the services that "
        "take it (e.g. --cache-bytes, --max-num-seqs, --device).",
    )
    serve.add_argument("--model", default=None, help="checkpoint dir or hub id (default: demo)")
    serve.add_argument(
        "--family",
        choices=list(DEMO_FAMILIES),
        default=None,
        help=f"serve a generated demo checkpoint of this family (default: {DEFAULT_FAMILY})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    serve.add_argument("--port", type=port_number, default=50051, help="the gateway's gRPC port")
    serve.add_argument(
        "--max-chunk-tokens",
        type=int,
        default=None,
        help="most prompt tokens per prefill chunk (default: the decoder's)",
    )
    serve.add_argument(
        "--http-port",
        type=port_number,
        default=8000,
        help="the OpenAI-compatible HTTP API (0: off)",
    )
    serve.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every service to load its model and serve",
    )
    serve.add_argument(
        "--encoders",
        type=replica_count,
        default=1,
        help="encoder replicas to start (the gateway and every decoder get every address)",
    )
    serve.add_argument(
        "--decoders",
        type=replica_count,
        default=1,
        help="decoder replicas to start (the gateway gets every address)",
    )
    serve.add_argument(
        "--colocated",
        action="store_true",
        help="no encoder service: each decoder runs the encoder in its own process "
        "(--colocated-encoder), as vLLM v1 does; --encoders and --redis-url do not apply",
    )
    serve.add_argument(
        "--redis-url",
        default=None,
        help="shared L2 cache for every encoder, e.g. redis://127.0.0.1:6379/0 "
        "(default: the encoders' own, env TESSERA_REDIS_URL)",
    )
    serve.add_argument(
        "--tls",
        choices=["off", "auto"],
        default="off",
        help="auto: a throwaway CA and a certificate per role, mutual TLS on every gRPC hop "
        "(the start message names the client certificate)",
    )

    text = "send one request to a gateway and print the answer as it streams"
    generate = commands.add_parser(
        "generate", help=text, description=text, formatter_class=HelpFormatter
    )
    generate.add_argument("prompt", help="the user message's text (after the media)")
    generate.add_argument("--server", default="127.0.0.1:50051", help="the gateway's host:port")
    generate.add_argument("--image", action="append", default=[], help="image file (repeatable)")
    generate.add_argument(
        "--audio",
        action="append",
        default=[],
        help="audio file: WAV, FLAC, OGG, MP3, ... (repeatable; after the images)",
    )
    generate.add_argument(
        "--video",
        action="append",
        default=[],
        help="video file: MP4, WebM, MKV, MOV (repeatable; after the audio); frames are "
        "sampled at 2 per second unless --mm-processor-kwargs says '{\"fps\": 1}' or "
        "'{\"num_frames\": 16}'",
    )
    generate.add_argument("--max-tokens", type=int, default=64, help="most tokens to generate")
    generate.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)"
    )
    generate.add_argument("--seed", type=int, default=None, help="seed for sampling")
    generate.add_argument("--json", action="store_true", help="print one JSON object")
    generate.add_argument(
        "--mm-processor-kwargs",
        type=json.loads,
        default=None,
        help="processor settings for the media, as JSON, e.g. '{\"max_pixels\": 200704}'",
    )
    add_tls_flags(generate)
    generate.add_argument(
        "--api-key",
        default=env_default("TESSERA_API_KEY", ""),
        help="the gateway's API key, if it has any (env TESSERA_API_KEY)",
    )

    text = "write a random-weight checkpoint of a supported family (no downloads)"
    demo = commands.add_parser(
        "make-demo-model", help=text, description=text, formatter_class=HelpFormatter
    )
    demo.add_argument("dir", help="directory to write the checkpoint to")
    demo.add_argument(
        "--family", choices=list(DEMO_FAMILIES), default=DEFAULT_FAMILY, help="model family"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    demo.add_argument(
        "--size",
        choices=list(DEMO_MODEL_SIZES),
        default="tiny",
        help="tiny: for tests and trying it out; bench: larger, for benchmarks",
    )
    return parser


def needs_services(argv: list[str]) -> bool:
    """Whether the command line names a service command (the top level takes only
    --help and --version, so the first word that is not a flag is the command)."""
    command = next((word for word in argv if not word.startswith("-")), None)
    return command in SERVICE_COMMANDS


def quiet_when_the_reader_leaves(
    command: Callable[[argparse.Namespace], None], args: argparse.Namespace
) -> None:
    """Runs a command that prints; when the reader of its output goes away (`tessera
    generate ... | head`), it stops with status 1 and no traceback, as Python's docs
    advise for SIGPIPE. Leaving the command closes its client, which cancels the
    request on the gateway and the decoder."""
    try:
        command(args)
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit; point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(with_services=needs_services(argv))
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in SERVICE_COMMANDS:
        from tessera.preflight import bounds_problem

        problem = bounds_problem(args.command, args)
        if problem:  # e.g. --max-batch-items 0 would never take an item off the queue
            print(f"tessera {args.command}: {problem}", file=sys.stderr)
            raise SystemExit(2)
    if args.command == "encoder":
        from encoder_service.main import main as run
    elif args.command == "decoder":
        from decoder_service.main import main as run
    elif args.command == "gateway":
        from gateway.main import main as run
    elif args.command == "serve":
        return cmd_serve(args, extra)
    elif args.command == "generate":
        return quiet_when_the_reader_leaves(cmd_generate, args)
    else:
        return cmd_make_demo_model(args)
    try:
        run(args)
    except (PortTakenError, TlsFilesError, StartupError) as error:
        # A start-up error, not a crash: one line (and the traceback with --log-level debug).
        if is_debug(args.log_level):
            traceback.print_exc()
        raise SystemExit(f"tessera {args.command}: {one_line(error)}") from None


if __name__ == "__main__":
    sys.exit(main())
