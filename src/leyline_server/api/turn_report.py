"""What a chat turn reports: the ``leyline`` field, and the same facts as ``x-leyline-*`` headers.

:func:`turn_result` is the field (on a chat completion, its last stream chunk, a Messages
``message_delta``, a Responses ``response``); :func:`report_headers` its headers on a whole
(non-streamed) answer. A streamed answer's headers go out before the prefill, so they carry only
what is known then (:meth:`~leyline_server.api.pipeline.PreparedTurn.headers`).
"""

from __future__ import annotations

from urllib.parse import quote

from leyline_sdk.core.directives import digest
from leyline_sdk.core.wire import BaseRef, LeylineResult
from leyline_server.api.service import ChatTurn

__all__ = ["turn_result", "report_headers", "names_header"]


def turn_result(chat: ChatTurn) -> LeylineResult:
    """The ``leyline`` field of a chat turn's answer."""
    turn = chat.turn
    reused, rotated, prefilled = turn.counts()
    tokens = turn.prompt + turn.generated
    report = turn.report
    sources = list(chat.auto.sources) if chat.auto_splice and chat.auto else []
    return LeylineResult(
        session_id=chat.session.id if chat.session else None,
        base=BaseRef(length=len(tokens), digest=digest(tokens)),
        applied=chat.fallback is None,
        fallback=chat.fallback,
        auto_splice=chat.auto_splice,
        reused_tokens=reused,
        rotated_tokens=rotated,
        prefilled_tokens=prefilled,
        approximate_tokens=turn.approximate_tokens,
        canary=report.canary if report else "skipped",
        completion_token_ids=list(turn.generated),
        splice_ms=report.splice_ms if report else 0.0,
        sources=sources,
        template_directives=sources.count("template"),
        client_directives=sources.count("client"),
        timings=dict(chat.timings),
    )


def report_headers(result: LeylineResult) -> dict[str, str]:
    """``X-Leyline-*`` headers: the session, the token counts, the fallback and who made the directives."""
    out = {
        "x-leyline-reused-tokens": str(result.reused_tokens),
        "x-leyline-rotated-tokens": str(result.rotated_tokens),
        "x-leyline-prefilled-tokens": str(result.prefilled_tokens),
        "x-leyline-approximate-tokens": str(result.approximate_tokens),
    }
    if result.session_id:
        out["x-leyline-session"] = result.session_id
    if result.fallback is not None:
        out["x-leyline-fallback"] = result.fallback.code
    if result.sources:
        out["x-leyline-spliced"] = ",".join(f"{s}={result.sources.count(s)}" for s in sorted(set(result.sources)))
    return out


HEADER_NAME_CHARS, HEADER_CHARS = 64, 1024


def names_header(names: list[str]) -> str:
    """Names as a header value (``x-leyline-tools-not-offered``): each percent-encoded outside
    printable ASCII (a name may hold any character, CR and LF included), cut at 64 characters, the
    list cut at about 1 KiB with ``+N more``."""
    out: list[str] = []
    size = 0
    for i, name in enumerate(names):
        value = quote(name[:HEADER_NAME_CHARS], safe=" !#$&'()*+-./:;<=>?@[]^_`{|}~")
        if size + len(value) > HEADER_CHARS:
            out.append(f"+{len(names) - i} more")
            break
        out.append(value)
        size += len(value) + 1
    return ",".join(out)
