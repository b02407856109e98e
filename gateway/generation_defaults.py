"""Sampling defaults from the checkpoint's generation_config.json, as vLLM takes them.

`--generation-config auto` (the default) reads the checkpoint's generation config and uses
its temperature, top_p, top_k, min_p and repetition_penalty for the fields an HTTP request
leaves unset; `vllm` uses the neutral defaults (greedy unless the request says otherwise).
Like vLLM, only values the checkpoint sets (its diff from GenerationConfig's own
defaults) count, and `do_sample` is not consulted.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields

from tessera.sampling import check_sampling
from tessera.v1 import common_pb2

log = logging.getLogger("tessera.gateway")

GENERATION_CONFIG_MODES = ("auto", "vllm")


@dataclass(frozen=True)
class SamplingDefaults:
    """None: the field has no default beyond the API's neutral one."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


NEUTRAL = SamplingDefaults()


def load_sampling_defaults(model: str, mode: str) -> SamplingDefaults:
    """The defaults for `--generation-config mode` on checkpoint `model` (a directory or a
    hub id). A checkpoint without a generation config has none; one whose values no
    request could send is refused at start-up, naming the value."""
    if mode not in GENERATION_CONFIG_MODES:
        raise ValueError(f"--generation-config must be one of {GENERATION_CONFIG_MODES}")
    if mode == "vllm":
        return SamplingDefaults()
    from transformers import GenerationConfig  # only when asked: it is slow to import

    try:
        config = GenerationConfig.from_pretrained(model)
    except OSError:  # no generation_config.json: nothing to default
        return SamplingDefaults()
    return defaults_from_dict(config.to_diff_dict())


def defaults_from_dict(values: dict) -> SamplingDefaults:
    chosen = {
        f.name: values[f.name] for f in fields(SamplingDefaults) if values.get(f.name) is not None
    }
    for name, value in chosen.items():
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"generation_config.json: {name} must be a number, got {value!r}")
    if "top_k" in chosen:
        chosen["top_k"] = max(int(chosen["top_k"]), 0)  # HF and vLLM: negative is off
    defaults = SamplingDefaults(**chosen)
    _check(defaults)
    if chosen:
        log.info("sampling defaults from the checkpoint's generation_config: %s", chosen)
    return defaults


def _check(defaults: SamplingDefaults) -> None:
    """The bounds every request meets, checked once at start-up (else every request that
    leaves the field unset would be refused)."""
    params = common_pb2.SamplingParams(
        temperature=defaults.temperature or 0.0,
        top_p=defaults.top_p or 0.0,
        min_p=defaults.min_p or 0.0,
        repetition_penalty=defaults.repetition_penalty or 0.0,
    )
    try:
        check_sampling(params)
    except ValueError as error:
        raise ValueError(f"generation_config.json: {error}") from None
