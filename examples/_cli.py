"""What the examples share: a server to talk to (yours, or one started in-process) and one-line errors.

``--base-url`` follows the OpenAI client's convention: it includes ``/v1``
(``http://127.0.0.1:8000/v1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Coroutine, Iterator
from typing import Any

import openai

from leyline_server.local import local_service, serve_in_thread

__all__ = ["server", "run"]


@contextlib.contextmanager
def server(base_url: str | None, **service: Any) -> Iterator[str]:
    """``base_url`` as given, or the ``/v1`` URL of an embedded server started for the block."""
    if base_url:
        yield base_url.rstrip("/")
        return
    with serve_in_thread(local_service(**service)) as url:
        yield url + "/v1"


def run(main: Coroutine[Any, Any, None], base_url: str) -> int:
    """Run ``main``; a server that cannot be reached or answers 404 is one line on stderr, not a traceback."""
    try:
        asyncio.run(main)
    except openai.APIConnectionError as exc:
        print(f"leyline: cannot reach {base_url}: {exc}", file=sys.stderr)
        return 1
    except openai.APIStatusError as exc:
        status = exc.status_code
        hint = " (does the URL end in /v1?)" if status == 404 else ""
        print(f"leyline: {base_url} answered {status}{hint}: {exc}", file=sys.stderr)
        return 1
    return 0
