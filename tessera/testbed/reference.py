"""The correctness oracle: the checkpoint's own `generate()` on the same inputs, fed the
family's own processor outputs (for any supported family)."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoConfig, AutoProcessor, BatchFeature

from tessera.client import Audio, Video
from tessera.testbed.devices import RunOn
from tessera.testbed.media import noise_image  # noqa: F401  (tests import it from here)

# A test prompt: (role, parts), each part text, an encoded image (bytes), Audio or Video.
Part = str | bytes | Audio | Video
Messages = list[tuple[str, list[Part]]]
# Frames per second a video is sampled at unless a test says otherwise (the gateway's
# default for Qwen-VL).
REFERENCE_VIDEO_FPS = 2


def _template_part(part: Part) -> dict:
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if isinstance(part, Video):
        return {"type": "video"}
    return {"type": "audio" if isinstance(part, Audio) else "image"}


def to_template(messages: Messages) -> list[dict]:
    return [
        {"role": role, "content": [_template_part(p) for p in parts]} for role, parts in messages
    ]


def to_chat_inputs(messages: Messages) -> list:
    """The same messages as the gateway's ChatInput objects."""
    from gateway.prompt import ChatInput, MediaPart, TextPart
    from tessera.placeholders import Modality

    def part(p: Part) -> TextPart | MediaPart:
        if isinstance(p, str):
            return TextPart(p)
        if isinstance(p, Audio):
            return MediaPart(Modality.AUDIO, p.data)
        if isinstance(p, Video):
            return MediaPart(Modality.VIDEO, p.data)
        return MediaPart(Modality.IMAGE, p)

    return [ChatInput(role, [part(p) for p in parts]) for role, parts in messages]


def reference_audio(data: bytes, sampling_rate: int) -> np.ndarray:
    """A clip as the reference feeds it: read by libsndfile (not the gateway's FFmpeg
    path), channels averaged, resampled by soxr at librosa's default quality."""
    import soundfile
    import soxr

    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1, dtype=np.float64).astype(np.float32)
    if rate == sampling_rate:
        return mono
    return soxr.resample(mono, rate, sampling_rate, quality="HQ").astype(np.float32)


def reference_video(
    data: bytes, video_processor: object, fps: int | None = None, num_frames: int | None = None
) -> tuple[np.ndarray, object]:
    """A video as the reference feeds it: every frame decoded by a plain PyAV loop (not
    the gateway's tessera.video), the frames the video processor's own `sample_frames`
    picks, and their metadata. Returns (frames [n, h, w, 3] uint8, VideoMetadata)."""
    import av
    from transformers.video_utils import VideoMetadata

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate)
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(stream)])
    metadata = VideoMetadata(
        total_num_frames=len(frames),
        fps=rate,
        width=frames.shape[2],
        height=frames.shape[1],
        duration=len(frames) / rate,
        video_backend="pyav",
    )
    if num_frames is None:
        fps = fps or REFERENCE_VIDEO_FPS
    indices = [
        int(i) for i in video_processor.sample_frames(metadata, num_frames=num_frames, fps=fps)
    ]
    metadata.frames_indices = indices
    return frames[indices], metadata


@dataclass
class ReferenceOutput:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logits: list[torch.Tensor]  # [vocab] float32 per generated step, on the CPU
    # Where generate() ran: what counts as a tie in its dtype (tessera.testbed.devices).
    run_on: RunOn = field(default_factory=RunOn)


class Reference:
    def __init__(self, model_dir: Path, run_on: RunOn | None = None):
        """The checkpoint on `run_on`'s device, in its dtype (default: float32 on the CPU,
        whatever dtype the checkpoint was saved in)."""
        self.run_on = run_on = run_on or RunOn()
        self.processor = AutoProcessor.from_pretrained(model_dir)
        architecture = AutoConfig.from_pretrained(model_dir).architectures[0]
        model = getattr(transformers, architecture).from_pretrained(
            model_dir, dtype=run_on.torch_dtype
        )
        self.model = model.to(run_on.device).eval()
        config = self.model.config
        self.hidden_size = config.get_text_config().hidden_size
        # The placeholder token of the family's media (images or audio; videos have their own).
        self.placeholder_token_id = getattr(config, "image_token_id", None) or getattr(
            config, "audio_token_id", None
        )
        # Qwen3-VL's rows carry the deepstack levels beside the main plane.
        deepstack = getattr(getattr(config, "vision_config", None), "deepstack_visual_indexes", [])
        self.num_planes = 1 + len(deepstack or [])

    @property
    def row_bytes(self) -> int:
        """Bytes of one embedding row, every plane, in the run's dtype (the encoder's)."""
        return self.hidden_size * self.num_planes * self.run_on.torch_dtype.itemsize

    @property
    def renders_token_ids(self) -> bool:
        """Mistral's tokenizer (Voxtral) renders conversations itself, audio included."""
        return type(self.processor.tokenizer).__name__ == "MistralCommonBackend"

    def inputs(self, messages: Messages, **processor_kwargs: object) -> BatchFeature:
        """The processor's inputs, on the run's device; pixel values and audio
        features in its dtype, as the model takes them."""
        processed = self._processed(messages, **processor_kwargs)
        return BatchFeature({name: self._placed(value) for name, value in processed.items()})

    def _placed(self, value: object) -> object:
        if not isinstance(value, torch.Tensor):
            return value
        dtype = self.run_on.torch_dtype if value.is_floating_point() else None
        return value.to(self.run_on.device, dtype)

    def _processed(self, messages: Messages, **processor_kwargs: object) -> dict:
        if self.renders_token_ids:
            return self._mistral_inputs(messages)
        text = self.processor.apply_chat_template(
            to_template(messages), add_generation_prompt=True, tokenize=False
        )
        images = [
            Image.open(io.BytesIO(p))
            for _, parts in messages
            for p in parts
            if isinstance(p, bytes)
        ]
        clips = [p for _, parts in messages for p in parts if isinstance(p, Audio)]
        videos = [p for _, parts in messages for p in parts if isinstance(p, Video)]
        if videos:
            sampling = {
                k: processor_kwargs.pop(k) for k in ("fps", "num_frames") if k in processor_kwargs
            }
            loaded = [
                reference_video(v.data, self.processor.video_processor, **sampling) for v in videos
            ]
            processor_kwargs = {
                "videos": [frames for frames, _ in loaded],
                "video_metadata": [metadata for _, metadata in loaded],
                "do_sample_frames": False,
                "cap_pixels_per_frame": False,
                **processor_kwargs,
            }
        if clips:
            rate = self.processor.feature_extractor.sampling_rate
            processor_kwargs = {
                "audio": [reference_audio(clip.data, rate) for clip in clips],
                "sampling_rate": rate,
                **processor_kwargs,
            }
        # One sample's images as one nested list, as the chat path passes them: a flat list
        # reads as one image per sample (LLaVA-OneVision would tile each one).
        return self.processor(
            text=text,
            images=[images] if images else None,
            return_tensors="pt",
            add_special_tokens=False,
            **processor_kwargs,
        )

    def _mistral_inputs(self, messages: Messages) -> dict:
        """The processor's own chat path: each clip as a base64 WAV at the model's rate
        (float32, so mistral-common reads exactly the reference samples)."""
        import soundfile

        rate = self.processor.feature_extractor.sampling_rate

        def part(p: str | Audio) -> dict:
            if isinstance(p, str):
                return {"type": "text", "text": p}
            buffer = io.BytesIO()
            soundfile.write(buffer, reference_audio(p.data, rate), rate, "FLOAT", format="WAV")
            return {"type": "audio", "base64": base64.b64encode(buffer.getvalue()).decode()}

        conversation = [
            {"role": role, "content": [part(p) for p in parts]} for role, parts in messages
        ]
        return self.processor.apply_chat_template(conversation, tokenize=True, return_dict=True)

    @torch.inference_mode()
    def generate(
        self,
        messages: Messages,
        max_new_tokens: int,
        **processor_kwargs: object,
    ) -> ReferenceOutput:
        inputs = self.inputs(messages, **processor_kwargs)
        out = self.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        prompt = inputs["input_ids"][0].tolist()
        return ReferenceOutput(
            prompt_token_ids=prompt,
            token_ids=out.sequences[0, len(prompt) :].tolist(),
            logits=[step[0].float().cpu() for step in out.logits],
            run_on=self.run_on,
        )


# Near-ties met by assert_greedy_match, reported at the end of the session.
NEAR_TIES: list[str] = []


def assert_greedy_match(ours: list[int], reference: ReferenceOutput, case: str = "") -> bool:
    """Tokens must be identical; at the first difference (if any) the reference must have
    been at a true near-tie, and then only the prefix up to it is compared. Returns True
    when a near-tie was accepted (and records it in NEAR_TIES)."""
    for step, (mine, theirs) in enumerate(zip(ours, reference.token_ids, strict=False)):
        if mine == theirs:
            continue
        top2 = torch.topk(reference.logits[step], 2).values
        gap = float(top2[0] - top2[1])
        assert gap < reference.run_on.near_tie(float(top2[0])), (
            f"greedy tokens differ at step {step} ({mine} vs reference {theirs}) and the "
            f"reference's top-2 logit gap is {gap:.3g}, not a near-tie: a real bug\n"
            f"ours:      {ours}\nreference: {reference.token_ids}"
        )
        NEAR_TIES.append(f"{case or 'a case'}: step {step}, top-2 gap {gap:.2g}")
        return True
    assert len(ours) == len(reference.token_ids), (ours, reference.token_ids)
    return False
