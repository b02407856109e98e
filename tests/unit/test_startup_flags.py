"""The flags a vLLM user expects, parsed in each of their forms, and refused with a message
that names what is wrong; --limit-mm-per-prompt and --chat-template as the gateway's
prompt builder applies them."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from PIL import Image

from decoder_service.config import DecoderConfig
from decoder_service.main import build_parser as decoder_parser
from gateway.config import GatewayConfig
from gateway.main import build_parser as gateway_parser
from gateway.prompt import PromptBuilder, PromptError
from tessera.adapters import LoadOptions, ModelPart, load_family
from tessera.demo_models import make_demo_model
from tessera.media_decoder import MediaLimits
from tessera.model_files import checkpoint_dtype
from tessera.startup_flags import (
    MediaCountLimits,
    dtype_flag,
    limit_mm_per_prompt,
    load_chat_template,
    log_level,
    port_number,
    resolve_dtype,
)
from tessera.testbed.reference import noise_image, to_chat_inputs, to_template

GATEWAY = ["--model", "m", "--encoders", "e:1", "--decoders", "d:1"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('{"image": 4, "audio": 1}', ({"image": 4, "audio": 1}, 16)),
        ("image=4,audio=1", ({"image": 4, "audio": 1}, 16)),
        (" image = 2 ", ({"image": 2}, 16)),
        ('{"audio": 0}', ({"audio": 0}, 16)),
        ("5", ({}, 5)),
    ],
)
def test_limit_mm_per_prompt_forms(value, expected):
    limits = limit_mm_per_prompt(value)
    assert (dict(limits.per_modality), limits.default) == expected
    assert limits.limit("image") == expected[0].get("image", expected[1])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ('{"video": 1}', "unknown modality 'video'"),
        ("image=-1", "whole number >= 0"),
        ('{"image": 1.5}', "whole number >= 0"),
        ('{"image": true}', "whole number >= 0"),
        ('{"image": {"count": 2}}', "whole number >= 0"),
        ('{"image": 4', "not valid JSON"),
        ("image", "not MODALITY=N"),
        ("-3", "not MODALITY=N"),
        ("", "give image=N"),
    ],
)
def test_limit_mm_per_prompt_refusals_say_what_is_wrong(value, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        limit_mm_per_prompt(value)


def test_the_gateway_parses_every_form_into_its_config():
    for value in ('{"image": 3}', "image=3", "3"):
        args = gateway_parser().parse_args([*GATEWAY, "--limit-mm-per-prompt", value])
        assert GatewayConfig.from_args(args).limit_mm_per_prompt.limit("image") == 3
    default = GatewayConfig.from_args(gateway_parser().parse_args(GATEWAY))
    assert default.limit_mm_per_prompt == MediaCountLimits()


def test_serve_routes_every_served_name_to_the_gateway():
    from tessera.launcher import route_flags
    from tessera.preflight import service_parsers

    extra = ["--served-model-name", "a", "b", "--max-num-seqs", "2", "--served-model-name=c"]
    routed = route_flags(extra, service_parsers())
    names = ["--served-model-name", "a", "b", "--served-model-name=c"]
    assert routed["gateway"] == names
    # The decoder takes them too (the model_name label of its metrics).
    assert routed["decoder"] == ["--served-model-name", "a", "b", "--max-num-seqs", "2", names[-1]]
    assert routed["encoder"] == []


def test_served_model_names_take_one_or_more():
    args = gateway_parser().parse_args([*GATEWAY, "--served-model-name", "a", "b"])
    assert args.served_model_name == ["a", "b"]
    assert gateway_parser().parse_args(GATEWAY).served_model_name is None


@pytest.mark.parametrize(
    ("value", "name"),
    [("auto", "auto"), ("half", "float16"), ("float", "float32"), ("BFloat16", "bfloat16")],
)
def test_dtype_names_and_vllm_aliases(value, name):
    assert dtype_flag(value) == name


def test_dtype_refusal_lists_the_choices():
    with pytest.raises(argparse.ArgumentTypeError, match="auto, float32, bfloat16, float16"):
        dtype_flag("int8")
    assert decoder_parser().parse_args(["--model", "m"]).dtype == "auto"


@pytest.mark.parametrize(
    ("flag", "checkpoint", "device", "expected"),
    [
        ("auto", "bfloat16", "cuda", "bfloat16"),
        ("auto", "float16", "cuda:1", "float16"),
        ("auto", "bfloat16", "cpu", "float32"),
        ("auto", "float16", "cpu", "float32"),
        ("auto", "float32", "cuda", "float32"),
        ("auto", None, "cuda", "float32"),
        ("auto", "float8_e4m3fn", "cuda", "float32"),
        ("bfloat16", "float32", "cpu", "bfloat16"),
    ],
)
def test_auto_dtype_follows_the_checkpoint(flag, checkpoint, device, expected):
    assert resolve_dtype(flag, checkpoint, device) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"dtype": "bfloat16"}, "bfloat16"),
        ({"torch_dtype": "float16"}, "float16"),
        ({"text_config": {"torch_dtype": "bfloat16"}}, "bfloat16"),
        ({"architectures": ["X"]}, None),
    ],
)
def test_checkpoint_dtype_reads_config_json(tmp_path, config, expected):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert checkpoint_dtype(tmp_path) == expected


def test_the_prefill_token_budget_defaults_to_one_chunk_and_refuses_negatives():
    def config(*flags: str) -> DecoderConfig:
        args = decoder_parser().parse_args(["--model", "m", "--encoders", "e:1", *flags])
        return DecoderConfig.from_args(args)

    assert config("--max-chunk-tokens", "256").prefill_token_budget == 256
    given = config("--max-chunk-tokens", "256", "--max-prefill-tokens-per-step", "1024")
    assert given.prefill_token_budget == 1024
    for flag in ("--max-prefill-tokens-per-step", "--max-prefills-per-step"):
        with pytest.raises(SystemExit, match="must be >= 0"):
            config(flag, "-1")


def test_the_stream_interval_defaults_to_every_token_and_refuses_less_than_one():
    def config(*flags: str) -> DecoderConfig:
        args = decoder_parser().parse_args(["--model", "m", "--encoders", "e:1", *flags])
        return DecoderConfig.from_args(args)

    assert config().stream_interval == 1
    assert config("--stream-interval", "4").stream_interval == 4
    with pytest.raises(SystemExit, match="--stream-interval must be >= 1 token, got 0"):
        config("--stream-interval", "0")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--encoders", "127.0.0.1:50052,[::1]:50052"], True),  # tessera serve's kind
        (["--encoders", "localhost:50052,0.0.0.0:50052"], True),
        (["--encoders", "127.0.0.1:50052,10.0.0.7:50052"], False),  # one elsewhere
        (["--encoders", "dns:///tessera-encoder:50052"], False),  # Kubernetes
        (["--encoders", "10.0.0.7:50052", "--encoders-share-cpus"], True),
        (["--encoders", "127.0.0.1:50052", "--no-encoders-share-cpus"], False),
        (["--encoders", "127.0.0.1:50052", "--no-adapt-torch-threads"], False),
        (["--colocated-encoder"], False),  # computes between forwards, on their thread
        ([], False),
    ],
)
def test_forwards_hold_one_thread_while_encoders_on_this_host_compute(flags, expected):
    args = decoder_parser().parse_args(["--model", "m", *flags])
    assert DecoderConfig.from_args(args).hold_threads_while_encoding is expected


def test_encoders_sharing_cpus_is_refused_with_a_colocated_encoder():
    args = decoder_parser().parse_args(
        ["--model", "m", "--colocated-encoder", "--encoders-share-cpus"]
    )
    with pytest.raises(SystemExit, match="--encoders-share-cpus is for encoder services"):
        DecoderConfig.from_args(args)


def test_ports_and_log_levels():
    assert port_number("0") == 0 and port_number("65535") == 65535
    for bad in ("65536", "-1", "http"):
        with pytest.raises(argparse.ArgumentTypeError):
            port_number(bad)
    assert log_level("debug") == "DEBUG"
    with pytest.raises(argparse.ArgumentTypeError, match="not a log level"):
        log_level("loud")


def test_chat_template_from_a_file_or_inline(tmp_path):
    template = "{% for m in messages %}{{ m.role }}{% endfor %}"
    (tmp_path / "t.jinja").write_text(template)
    assert load_chat_template(str(tmp_path / "t.jinja")) == template
    assert load_chat_template(template) == template
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="does not parse"):
        load_chat_template("{% for m in messages %}")
    with pytest.raises(SystemExit):
        gateway_parser().parse_args([*GATEWAY, "--chat-template", "{% if %}"])


def test_help_shows_defaults_but_never_a_secret(monkeypatch, capsys):
    from tessera.cli import build_parser

    monkeypatch.setenv("TESSERA_API_KEY", "sk-very-secret")
    for command, shown in [("decoder", "(default: auto)"), ("generate", "(default: 64)")]:
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        assert shown in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    assert "sk-very-secret" not in capsys.readouterr().out


# -- the gateway's prompt builder -------------------------------------------------------

IMAGE = noise_image(41, 40, 30)
CUSTOM = (
    "{% for m in messages %}CUSTOM {{ m.role }}: {% for c in m.content %}"
    "{% if c.type == 'text' %}{{ c.text }}{% else %}<image>{% endif %}{% endfor %}\n"
    "{% endfor %}{% if add_generation_prompt %}BOT:{% endif %}"
)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory):
    return make_demo_model(tmp_path_factory.mktemp("llava") / "m")


def test_limits_are_per_modality_and_name_it(llava_dir):
    family = load_family(str(llava_dir), LoadOptions(ModelPart.PROCESSOR))
    prompt = to_chat_inputs([("user", [IMAGE, IMAGE, "Compare."])])
    builder = PromptBuilder(family, MediaLimits(10**8), limit_mm_per_prompt("image=1"))
    with pytest.raises(PromptError, match=r"2 image items; at most 1 image items"):
        builder.build(prompt)
    # Audio's limit does not bound images.
    assert PromptBuilder(family, MediaLimits(10**8), limit_mm_per_prompt("audio=0")).build(prompt)
    assert PromptBuilder(family, MediaLimits(10**8), 2).build(prompt)


def test_chat_template_override_renders_as_hf_would(llava_dir):
    from transformers import AutoProcessor

    family = load_family(str(llava_dir), LoadOptions(ModelPart.PROCESSOR, chat_template=CUSTOM))
    messages = [("user", [IMAGE, "What is it?"])]
    built = PromptBuilder(family, MediaLimits(10**8), 4).build(to_chat_inputs(messages))
    # The oracle: the checkpoint's own processor given the same template.
    processor = AutoProcessor.from_pretrained(llava_dir)
    expected = processor.apply_chat_template(
        to_template(messages), chat_template=CUSTOM, add_generation_prompt=True, tokenize=False
    )
    assert expected.startswith("CUSTOM user: <image>")
    image = Image.open(io.BytesIO(IMAGE))
    inputs = processor(
        text=expected, images=[[image]], return_tensors="pt", add_special_tokens=False
    )
    assert built.token_ids == inputs["input_ids"][0].tolist()
    default = load_family(str(llava_dir), LoadOptions(ModelPart.PROCESSOR))
    assert "CUSTOM" not in default.render_prompt(to_template(messages))


def test_auto_dtype_reaches_the_family(llava_dir, tmp_path):
    import shutil

    import torch

    half = shutil.copytree(llava_dir, tmp_path / "half")
    config = json.loads((half / "config.json").read_text())
    (half / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    parts = ModelPart.PROCESSOR
    assert load_family(str(half), LoadOptions(parts, "cpu", "auto")).dtype == torch.float32
    assert load_family(str(half), LoadOptions(parts, "cpu", "bfloat16")).dtype == torch.bfloat16


def test_the_gateway_sends_processed_images_only_with_a_certificate_to_be_trusted_by():
    certificate = ["--tls-cert-file", "gateway.pem", "--tls-key-file", "gateway.key"]
    ca = ["--tls-ca-file", "ca.pem"]

    def sends(*flags: str) -> bool:
        args = gateway_parser().parse_args([*GATEWAY, *flags])
        return GatewayConfig.from_args(args).sends_processed_images

    assert sends(*certificate, *ca)
    assert not sends(*certificate, *ca, "--no-send-processed-images")
    assert not sends()  # plaintext: no encoder can trust this gateway
    assert not sends(*ca)  # TLS without a client certificate: no name to trust


def test_an_encoder_batches_items_only_where_a_batch_is_cheaper_than_its_items():
    from encoder_service.config import EncoderConfig
    from encoder_service.main import build_parser as encoder_parser

    def batch_items(*flags: str) -> int:
        args = encoder_parser().parse_args(["--model", "m", *flags])
        return EncoderConfig.from_args(args).max_batch_items

    assert batch_items() == 1  # the CPU: each image to the decoder as soon as it is done
    assert batch_items("--device", "cuda") == 16
    assert batch_items("--device", "cuda:1") == 16
    assert batch_items("--max-batch-items", "4") == 4
    assert batch_items("--device", "cuda", "--max-batch-items", "1") == 1


def test_a_colocated_encoder_batches_as_the_encoder_service_would_on_its_device():
    from decoder_service.colocated import ColocatedEncoder
    from tests.unit.test_encoder_core import HeldFamily

    def batch_items(device: str) -> int:
        return ColocatedEncoder(HeldFamily(), 1 << 20, 1000, device).core.batcher.max_batch_items

    assert (batch_items("cpu"), batch_items("cuda")) == (1, 16)


def test_the_linear_kernel_takes_its_default_from_the_environment(monkeypatch):
    """TESSERA_LINEAR_KERNEL sets the default (tests/conftest.py sets torch for the
    decoders the tests start); a flag wins; a bad value says what to use."""
    monkeypatch.delenv("TESSERA_LINEAR_KERNEL", raising=False)
    assert decoder_parser().parse_args(["--model", "m"]).linear_kernel == "auto"
    monkeypatch.setenv("TESSERA_LINEAR_KERNEL", "onednn")
    assert decoder_parser().parse_args(["--model", "m"]).linear_kernel == "onednn"
    flagged = decoder_parser().parse_args(["--model", "m", "--linear-kernel", "torch"])
    assert flagged.linear_kernel == "torch"
    monkeypatch.setenv("TESSERA_LINEAR_KERNEL", "fast")
    with pytest.raises(SystemExit, match="TESSERA_LINEAR_KERNEL='fast': use one of"):
        decoder_parser()
