"""Hashes that name full KV blocks for prefix caching.

Block `i` of a sequence covers positions `[i * block_size, (i + 1) * block_size)`. Its
hash chains the previous block's hash, the block's token ids, and, for every position
covered by a media item, the item's content hash and the row of the item it holds:

    h_i = H(h_{i-1}, token_ids[block], [(content_hash, first_row, pos_in_block, num_rows)...])

so the same image at another offset, another image, or the same text after another
prefix never matches. Example with block_size 4 and an image at positions [2, 8):

    block 0: positions 0-3, rows 0-1 of the image at positions 2-3
    block 1: positions 4-7, rows 2-5 of the image at positions 4-7
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from tessera.placeholders import PlaceholderRange, overlap

_ROOT = b"tessera-kv-block-v1"


def block_hashes(
    token_ids: Sequence[int],
    ranges: Sequence[PlaceholderRange],
    block_size: int,
    known: Sequence[bytes] = (),
    salt: str = "",
) -> list[bytes]:
    """Hashes of every full block of `token_ids`; the first `len(known)` are reused.
    Only sequences with the same `salt` can share blocks."""
    hashes = list(known)
    parent = (
        hashes[-1] if hashes else hashlib.blake2b(_ROOT + salt.encode(), digest_size=16).digest()
    )
    for index in range(len(hashes), len(token_ids) // block_size):
        start, end = index * block_size, (index + 1) * block_size
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(struct.pack(f"<{block_size}I", *token_ids[start:end]))
        for item in ranges:
            hit = overlap(start, end, item.offset, item.end)
            if hit is not None:
                digest.update(item.content_hash.encode())
                digest.update(
                    struct.pack(
                        "<III",
                        hit[0] - item.offset + item.row_start,
                        hit[0] - start,
                        hit[1] - hit[0],
                    )
                )
        parent = digest.digest()
        hashes.append(parent)
    return hashes
