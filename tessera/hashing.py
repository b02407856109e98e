"""Content hashes: the names embedding rows are cached under.

A content hash covers everything the rows depend on, in a versioned, length-framed
encoding (so no two different field sequences serialize to the same bytes):

    "tessera-content" | version | model_fingerprint | modality | mode | shape | options
                      | content

`shape` is part of it because the same pixel bytes at 30x100 and 100x30 are different
images; `options` are the processing options that change the rows (Qwen-VL's
`min_pixels`/`max_pixels`, ...), as sorted (name, value) pairs, so two settings never
share an entry. The digest is BLAKE2b-256 (hex, 64 characters).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# 2: processing options joined the key.
HASH_SCHEMA_VERSION = 2
CONTENT_HASH_HEX_LENGTH = 64
_DIGEST_BYTES = 32
# Weight files up to this size are hashed whole; larger ones by sampled blocks, since
# reading 14 GB of weights on every start would cost minutes.
_MAX_WHOLE_FILE_BYTES = 256 << 20
_SAMPLE_BLOCK_BYTES = 1 << 20
_NUM_SAMPLE_BLOCKS = 64


def _frame(parts: Iterable[bytes]) -> Iterable[bytes]:
    for part in parts:
        yield struct.pack("<Q", len(part))
        yield part


def framed_digest(parts: Iterable[bytes]) -> str:
    """BLAKE2b-256 over each part prefixed by its 8-byte little-endian length."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for piece in _frame(parts):
        digest.update(piece)
    return digest.hexdigest()


def content_hash(
    model_fingerprint: str,
    modality: str,
    mode: str,
    shape: Sequence[int],
    content: bytes | memoryview,
    options: Mapping[str, int] | None = None,
) -> str:
    """The cache name of one decoded media item.

    `mode` is the decoded sample format (an image's PIL mode such as "RGB"), `shape` the
    decoded dimensions (an image's width, height), `content` the decoded samples,
    `options` the processing options that change its rows.
    """
    pairs = sorted((options or {}).items())
    return framed_digest(
        [
            b"tessera-content",
            str(HASH_SCHEMA_VERSION).encode(),
            model_fingerprint.encode(),
            modality.encode(),
            mode.encode(),
            struct.pack(f"<{len(shape)}Q", *shape),
            framed_digest(
                part for name, value in pairs for part in (name.encode(), struct.pack("<q", value))
            ).encode(),
            _flat(content),
        ]
    )


def _flat(content: bytes | memoryview) -> bytes | memoryview:
    """`content` as one run of bytes without copying it (a video's frames are hundreds
    of MiB): a contiguous view cast to bytes, whose length is its byte count."""
    if not isinstance(content, memoryview):
        return content
    return content.cast("B") if content.c_contiguous else bytes(content)


def salted_hash(content_hash: str, cache_salt: str) -> str:
    """The content hash a tenant's items go by: the hash itself without a salt, else a
    hash of both, so the same image under two salts is two cache entries and nobody
    without the salt can name (or probe for) the other tenant's entry.

    Example: salted_hash(h, "") == h; salted_hash(h, "team-a") != salted_hash(h, "team-b")
    """
    if not cache_salt:
        return content_hash
    return framed_digest([b"tessera-salted", content_hash.encode(), cache_salt.encode()])


def is_content_hash(value: str) -> bool:
    """True for a well-formed content hash (64 lowercase hex characters)."""
    return len(value) == CONTENT_HASH_HEX_LENGTH and all(c in "0123456789abcdef" for c in value)


def _file_digest(path: Path) -> bytes:
    size = path.stat().st_size
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    with path.open("rb") as f:
        if size <= _MAX_WHOLE_FILE_BYTES:
            for block in iter(lambda: f.read(_SAMPLE_BLOCK_BYTES), b""):
                digest.update(block)
        else:
            stride = (size - _SAMPLE_BLOCK_BYTES) // (_NUM_SAMPLE_BLOCKS - 1)
            for index in range(_NUM_SAMPLE_BLOCKS):
                f.seek(index * stride)
                digest.update(f.read(_SAMPLE_BLOCK_BYTES))
    return struct.pack("<Q", size) + digest.digest()


FINGERPRINT_FILE_PATTERNS = (
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "*.safetensors",
    "*.bin",
)


def model_fingerprint(model_dir: Path) -> str:
    """A short fingerprint of a checkpoint directory: its config, its processor config and
    its weights (whole files when small, 64 sampled 1 MiB blocks plus the size when large).

    Two checkpoints with the same config but other weights get other fingerprints; the
    same files always give the same one, on the gateway and on every encoder.
    """
    files = sorted(
        {p for pattern in FINGERPRINT_FILE_PATTERNS for p in model_dir.glob(pattern)},
        key=lambda p: p.name,
    )
    if not files:
        raise FileNotFoundError(f"no config or weight files in {model_dir}")
    parts: list[bytes] = [b"tessera-model", str(HASH_SCHEMA_VERSION).encode()]
    for path in files:
        parts += [path.name.encode(), _file_digest(path)]
    return framed_digest(parts)[:32]
