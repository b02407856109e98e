"""Token ids -> text deltas: deltas add up to the full text, and a character split across
tokens is never sent half-done (no U+FFFD in a delta)."""

from __future__ import annotations

import random

import pytest

from gateway.detokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"
TEXTS = [
    "the cat sits on the red chair",
    "café au lait, crème brûlée",
    "a 🙂 face and a 🐈 cat",
    "日本語のテキスト",
    "mixed: naïve 👍🏽 ok",
]


def build_tokenizer(family: str):
    """The demo family's tokenizer: SentencePiece-style (LLaVA, Gemma 3) and byte-level
    BPE (Qwen)."""
    if family == "llava":
        from tessera.demo_models.llava import build_tokenizer_for_llava

        return build_tokenizer_for_llava()
    if family == "gemma3":
        from tessera.demo_models.gemma3 import build_tokenizer_for_gemma3

        return build_tokenizer_for_gemma3()
    from tessera.demo_models.qwen_vl import VARIANTS, build_qwen_tokenizer

    return build_qwen_tokenizer(VARIANTS[family])


@pytest.fixture(scope="module", params=["llava", "gemma3", "qwen2.5-vl"])
def tokenizer(request):
    return build_tokenizer(request.param)


@pytest.fixture(scope="module")
def decode(tokenizer):
    # As the adapters decode.
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


def stream(decode, token_ids: list[int], group_sizes: list[int]) -> list[str]:
    """Feeds the ids in groups of the given sizes (cycled); returns every delta and the
    flush."""
    detokenizer = IncrementalDetokenizer(decode)
    deltas, index, turn = [], 0, 0
    while index < len(token_ids):
        size = group_sizes[turn % len(group_sizes)]
        deltas.append(detokenizer.add(token_ids[index : index + size]))
        index, turn = index + size, turn + 1
    deltas.append(detokenizer.flush())
    return deltas


def test_tokenizer_splits_characters_across_tokens(tokenizer, decode):
    """The premise of the next tests: some single token decodes to an incomplete char."""
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1
    assert REPLACEMENT in decode(ids[:1])


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_text_one_token_at_a_time(tokenizer, decode, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(decode, ids, [1])
    assert "".join(deltas) == decode(ids) == text
    assert not any(REPLACEMENT in delta for delta in deltas)


@pytest.mark.parametrize("seed", range(5))
def test_deltas_concatenate_for_any_grouping(tokenizer, decode, seed):
    rng = random.Random(seed)
    text = " ".join(rng.choice(TEXTS) for _ in range(3))
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(decode, ids, [rng.randint(1, 4) for _ in range(8)])
    assert "".join(deltas) == text
    assert not any(REPLACEMENT in delta for delta in deltas)


def test_incomplete_character_waits_for_the_rest(tokenizer, decode):
    ids = tokenizer.encode("a🙂", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(decode)
    assert detokenizer.add(ids[:1]) == "a"
    for token_id in ids[1:-1]:
        assert detokenizer.add([token_id]) == ""
    assert detokenizer.add(ids[-1:]) == "🙂"
    assert detokenizer.flush() == ""


def test_flush_returns_the_incomplete_remainder(tokenizer, decode):
    ids = tokenizer.encode("ok🙂", add_special_tokens=False)
    cut = len(ids) - 1  # the emoji's last byte never arrives
    detokenizer = IncrementalDetokenizer(decode)
    sent = "".join(detokenizer.add([token_id]) for token_id in ids[:cut])
    assert sent == "ok"
    rest = detokenizer.flush()
    assert rest and set(rest) == {REPLACEMENT}
    assert sent + rest == decode(ids[:cut])


def test_flush_after_everything_was_sent_is_empty(tokenizer, decode):
    detokenizer = IncrementalDetokenizer(decode)
    assert detokenizer.add(tokenizer.encode("done", add_special_tokens=False)) == "done"
    assert detokenizer.flush() == ""


def test_special_tokens_add_no_text(tokenizer, decode):
    detokenizer = IncrementalDetokenizer(decode)
    ids = tokenizer.encode("hi", add_special_tokens=False)
    assert detokenizer.add(ids) == "hi"
    assert detokenizer.add([tokenizer.eos_token_id]) == ""
    assert detokenizer.flush() == ""


def test_with_a_fake_byte_decoder():
    """Same behaviour without a tokenizer: one byte per token."""
    data = "é✓".encode()

    def decode(ids):
        return bytes(ids).decode("utf-8", errors="replace")

    detokenizer = IncrementalDetokenizer(decode)
    deltas = [detokenizer.add([byte]) for byte in data]
    assert deltas == ["", "é", "", "", "✓"]


def test_each_step_decodes_a_short_window_however_long_the_output(tokenizer, decode):
    """Incremental: the ids decoded per token stay few as the output grows (decoding the
    whole output every time would pass 400 here)."""
    text = " ".join(TEXTS * 12)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 400
    longest: list[int] = []

    def windowed(token_ids):
        longest.append(len(token_ids))
        return decode(token_ids)

    deltas = stream(windowed, ids, [1])
    assert "".join(deltas) == decode(ids)
    assert max(longest) <= 8, max(longest)
