"""Bounds every service puts on what one caller may send, whoever the caller is."""

from __future__ import annotations

# A request id (and an encoder lease owner) is a label: a uuid is 32 characters, a
# client's own ids are rarely above 64. Longer ones are refused, not truncated.
MAX_REQUEST_ID_CHARS = 128
# Encoder addresses a decode request may name per item (hints the decoder walks on every
# fetch): the gateway names every encoder it knows, and no fleet has more.
MAX_ENCODER_HINTS = 256
# Items one Expedite call may name (the items a decoder idles for at one encoder).
MAX_EXPEDITE_HASHES = 256


def check_request_id(request_id: str, what: str = "request id") -> str:
    """`request_id` itself; raises ValueError if it is longer than MAX_REQUEST_ID_CHARS or
    holds anything but visible ASCII (it travels in gRPC metadata and HTTP headers, where
    control characters are invalid)."""
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise ValueError(
            f"the {what} has {len(request_id)} characters; at most {MAX_REQUEST_ID_CHARS}"
        )
    if not all("!" <= char <= "~" for char in request_id):
        raise ValueError(f"the {what} may hold only visible ASCII characters (no spaces)")
    return request_id


# A cache salt is a tenant's label or a digest of one (64 hex characters).
MAX_CACHE_SALT_CHARS = 256


def check_cache_salt(cache_salt: str) -> str:
    """`cache_salt` itself; raises ValueError if it is longer than MAX_CACHE_SALT_CHARS
    (it is hashed into every item's name and every prefix block of its requests)."""
    if len(cache_salt) > MAX_CACHE_SALT_CHARS:
        raise ValueError(
            f"cache_salt has {len(cache_salt)} characters; at most {MAX_CACHE_SALT_CHARS}"
        )
    return cache_salt


# A grammar (JSON Schema, regex, Lark) of structured outputs: compiling one costs time and
# memory in proportion to its text, so the text is bounded before anything parses it.
MAX_GRAMMAR_CHARS = 64 * 1024
