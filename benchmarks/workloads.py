"""Seeded benchmark requests: media items drawn from a pool with a given reuse,
multi-turn conversations whose items repeat across turns, text and output lengths in
ranges.

Images are seeded noise PNGs (incompressible, ~100-250 KB each, like photos); audio
items are seeded tone-and-noise WAV clips (16 kHz mono, 32 KB per second). Every
workload draws from its own seeds, so no two workloads share an item by accident.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from tessera.client import Audio, Video
from tessera.testbed.audio_files import wav_clip
from tessera.testbed.reference import noise_image
from tessera.testbed.video_files import make_video

WORDS = [
    *("the", "a", "red", "cat", "sits", "on", "old", "blue", "chair", "near", "one"),
    *("small", "window", "while", "birds", "fly", "over", "green", "hill", "and"),
    *("river", "light", "shows", "many", "quiet", "people", "in", "park", "describe"),
]

Item = bytes | Audio | Video  # an encoded image, an audio clip or a video
Message = tuple[str, list[str | Item]]


@dataclass(frozen=True)
class BenchRequest:
    messages: list[Message]
    max_tokens: int
    chunk_tokens: int
    cache_salt: str = ""

    @property
    def items(self) -> list[Item]:
        return [p for _, parts in self.messages for p in parts if not isinstance(p, str)]

    @property
    def key(self) -> str:
        """Names the request's content (not its chunking): equal keys, equal tokens."""
        digest = hashlib.sha256(str(self.max_tokens).encode())
        for role, parts in self.messages:
            digest.update(role.encode())
            for part in parts:
                if isinstance(part, Audio | Video):
                    digest.update(type(part).__name__.encode() + b":" + part.data)
                else:
                    digest.update(part if isinstance(part, bytes) else part.encode())
                digest.update(b"\0")
        return digest.hexdigest()[:16]

    def with_chunk(self, chunk_tokens: int, cache_salt: str = "") -> BenchRequest:
        return BenchRequest(self.messages, self.max_tokens, chunk_tokens, cache_salt)


@dataclass(frozen=True)
class Spec:
    """A workload: how its requests are drawn (shown in the output)."""

    name: str
    num_requests: int
    images_per_request: int
    reuse: float  # fraction of image occurrences that repeat an earlier one
    text_words: tuple[int, int] = (16, 64)
    output_tokens: tuple[int, int] = (16, 16)
    chunk_tokens: int = 128
    seed: int = 0
    # (min, max) side in px of the images drawn; None: the run's default for its family.
    image_side: tuple[int, int] | None = None
    # Audio families: (min, max) seconds of the clips drawn instead of images.
    clip_seconds: tuple[float, float] | None = None
    # Video: (min, max) seconds of the videos drawn instead of images, at `video_fps`
    # frames per second, `video_size` (width, height) px.
    video_seconds: tuple[int, int] | None = None
    video_fps: int = 4
    video_size: tuple[int, int] = (160, 120)
    turns: int = 1  # > 1: multi-turn conversations, num_requests = conversations x turns
    extra: dict[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        if self.turns > 1:
            shape = (
                f"{self.num_requests // self.turns} conversations x {self.turns} turns, "
                "a new image in half the turns"
            )
        else:
            kind = "clip" if self.clip_seconds else "video" if self.video_seconds else "img"
            shape = f"{self.num_requests} requests, {self.images_per_request} {kind}"
            shape += f", reuse {self.reuse:.0%}"
        return (
            f"{shape}, text {self.text_words[0]}-{self.text_words[1]} "
            f"words, output {self.output_tokens[0]}-{self.output_tokens[1]} tokens, "
            f"chunk {self.chunk_tokens}"
        )


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _item(rng: random.Random, seed: int, spec: Spec) -> Item:
    """A clip of `spec.clip_seconds` when set, a video of `spec.video_seconds`, else an
    image of `spec.image_side`."""
    if spec.clip_seconds:
        return wav_clip(seed, round(rng.uniform(*spec.clip_seconds), 2))
    if spec.video_seconds:
        width, height = spec.video_size
        num_frames = rng.randint(*spec.video_seconds) * spec.video_fps
        return Video(make_video(num_frames, spec.video_fps, width, height, "mp4", seed))
    if spec.image_side is None:
        raise ValueError("the workload has no image sides; give the spec its run's default")
    sides = spec.image_side
    return noise_image(seed, rng.randint(*sides), rng.randint(*sides))


def pool_requests(spec: Spec) -> list[BenchRequest]:
    """Single-turn requests; `reuse` of the image occurrences repeat a pool image (every
    pool image appears at least once, so the realised reuse is the asked one)."""
    rng = random.Random(spec.seed)
    occurrences = spec.num_requests * spec.images_per_request
    num_distinct = max(1, round(occurrences * (1 - spec.reuse)))
    pool = [_item(rng, spec.seed * 100_003 + i, spec) for i in range(num_distinct)]
    draws = pool + [rng.choice(pool) for _ in range(occurrences - num_distinct)]
    rng.shuffle(draws)
    requests = []
    for index in range(spec.num_requests):
        images = draws[index * spec.images_per_request : (index + 1) * spec.images_per_request]
        words = _text(rng, *spec.text_words).split()
        cut = rng.randint(0, min(8, len(words)))  # text before the images: ranges straddle
        parts: list[str | Item] = [" ".join(words[:cut])] if cut else []
        parts += [*images, " ".join(words[cut:])]
        requests.append(
            BenchRequest([("user", parts)], rng.randint(*spec.output_tokens), spec.chunk_tokens)
        )
    return requests


def multi_turn_requests(spec: Spec) -> list[BenchRequest]:
    """Conversations: each turn resends the history (earlier images and fixed assistant
    replies) plus a new user message that brings a new image half the time. Ordered turn
    by turn across conversations, so a group of `conversations` requests is one turn."""
    rng = random.Random(spec.seed)
    num_conversations = spec.num_requests // spec.turns
    histories: list[list[Message]] = [[] for _ in range(num_conversations)]
    seed = spec.seed * 100_003
    requests = []
    for turn in range(spec.turns):
        for history in histories:
            parts: list[str | Item] = []
            if turn == 0 or rng.random() < 0.5:
                seed += 1
                parts.append(_item(rng, seed, spec))
            parts.append(_text(rng, *spec.text_words))
            if history:
                history.append(("assistant", [_text(rng, 8, 24)]))
            history.append(("user", parts))
            requests.append(
                BenchRequest(
                    [(role, list(p)) for role, p in history],
                    rng.randint(*spec.output_tokens),
                    spec.chunk_tokens,
                )
            )
    return requests


def requests_for(spec: Spec) -> list[BenchRequest]:
    return multi_turn_requests(spec) if spec.turns > 1 else pool_requests(spec)


def realised_reuse(requests: list[BenchRequest]) -> float:
    items = [item for request in requests for item in request.items]
    return 1 - len(set(items)) / len(items) if items else 0.0
