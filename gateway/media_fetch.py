"""Turning an `image_url`, `audio_url` or `video_url` into bytes, safely.

`data:` URLs are decoded in place. http(s) URLs are fetched only from hosts listed in
`--allowed-media-domains`; every hop of a redirect is checked again; a host whose
addresses are private, loopback, link-local or otherwise not public is refused unless it
is listed in `--allow-private-media-hosts`; the size cap is enforced while streaming and
the whole fetch has a deadline. (The check resolves the host, then the client connects
by name: a DNS answer that changes in between is a known gap of this approach.)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

MAX_REDIRECTS = 3


class MediaURLError(ValueError):
    """An image_url that cannot be used; the message says why."""


@dataclass(frozen=True)
class MediaFetchPolicy:
    allowed_domains: tuple[str, ...]
    private_hosts: tuple[str, ...]
    timeout_seconds: float
    max_bytes: int


async def load_media_url(url: str, policy: MediaFetchPolicy) -> bytes:
    if url.startswith("data:"):
        return decode_data_url(url, policy.max_bytes)
    try:
        return await asyncio.wait_for(_fetch(url, policy), policy.timeout_seconds)
    except TimeoutError:
        raise MediaURLError(
            f"fetching {url} took longer than {policy.timeout_seconds:g}s"
        ) from None
    except (httpx.HTTPError, OSError):
        # One message for refused, reset and TLS-broken connections alike, so that the
        # answer does not tell which ports of an allowed host are open.
        raise MediaURLError(f"fetching {url} failed; check that the URL serves the file") from None


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """`data:image/png;base64,....` -> bytes."""
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise MediaURLError(
            "a data URL must look like data:<type>;base64,<base64 data> (data:audio/wav;base64,...)"
        )
    if len(payload) * 3 // 4 > max_bytes:
        raise MediaURLError(f"the data URL holds more than {max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise MediaURLError("the data URL's payload is not valid base64") from None


async def _fetch(url: str, policy: MediaFetchPolicy) -> bytes:
    async with httpx.AsyncClient(follow_redirects=False, timeout=policy.timeout_seconds) as client:
        for _ in range(MAX_REDIRECTS + 1):
            await check_url(url, policy)
            async with client.stream("GET", url) as response:
                if response.is_redirect:
                    url = urljoin(url, response.headers.get("location", ""))
                    continue
                if response.status_code != 200:
                    raise MediaURLError(f"fetching {url} gave HTTP {response.status_code}")
                return await _read_capped(response, url, policy.max_bytes)
    raise MediaURLError(f"{url} redirects more than {MAX_REDIRECTS} times")


async def _read_capped(response: httpx.Response, url: str, max_bytes: int) -> bytes:
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise MediaURLError(f"{url} is {declared} bytes, above the limit of {max_bytes}")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise MediaURLError(f"{url} is larger than the limit of {max_bytes} bytes")
    return bytes(body)


async def check_url(url: str, policy: MediaFetchPolicy) -> None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # "http://[::1" and other malformed authorities
        raise MediaURLError(f"media URL {url!r} is malformed") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MediaURLError(f"media URL {url!r}: use a data: URL or an http(s) URL")
    host = parts.hostname.lower()
    if host not in policy.allowed_domains:
        allowed = ", ".join(policy.allowed_domains) or "none: send the media as a data URL"
        raise MediaURLError(f"host {host} is not an allowed media domain ({allowed})")
    if host in policy.private_hosts:
        return
    for address in await _addresses(host, port or (443 if parts.scheme == "https" else 80)):
        if not address.is_global:
            raise MediaURLError(
                f"host {host} resolves to {address}, a private, loopback or link-local address"
            )


async def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as error:
        raise MediaURLError(f"cannot resolve {host}: {error}") from None
    return [ipaddress.ip_address(info[4][0]) for info in infos]
