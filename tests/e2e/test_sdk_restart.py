"""A server restart of ~10 s mid-conversation, under the SDK's default retries: no error, nothing lost.

The server stops between two turns; the next turn starts while it is down (its first request,
``/leyline/tokenize``, is refused) and a new server — sessions gone, as after a real restart —
comes up on the same port 10 s later. openai's retries (6 by default in ``AsyncLeyline``: at
least 17.6 s of backoff in total) carry the call over the gap.
"""

from __future__ import annotations

import contextlib
import threading
import time

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline
from tests.e2e.server_helpers import free_port, make_service, running_server

OUTAGE_S = 10.0


async def test_a_10_s_restart_mid_conversation_is_ridden_over_by_default_retries():
    port = free_port()
    client = AsyncLeyline(base_url=f"http://127.0.0.1:{port}/v1", policies=[TruncateOlderThanN(2)])
    messages = [SYSTEM, TASK]
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(contextlib.ExitStack())
        first.enter_context(running_server(make_service(kv_budget_mb=32), port=port))
        for turn in range(4):
            await client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=2)
            messages += agent_turn(turn)
        (session,) = client.sessions
        old_id = session.session_id
        replacement = make_service(kv_budget_mb=32)  # built now, so the outage is the sleep below
        first.close()  # the server is gone

        def restart() -> None:
            time.sleep(OUTAGE_S)
            stack.enter_context(running_server(replacement, port=port))

        thread = threading.Thread(target=restart, daemon=True)
        started = time.monotonic()
        thread.start()
        r = await client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=2)
        waited = time.monotonic() - started
        thread.join()
        assert waited >= OUTAGE_S  # the call really rode over the outage
        assert r.choices[0].message is not None and r.leyline["session_id"] != old_id
        assert session.stats[-1].fallback == "base_mismatch"  # the new server had no session: forget, served
        assert session.history == messages  # nothing lost
        for turn in range(4, 7):  # and the conversation splices again
            messages += agent_turn(turn)
            await client.chat.completions.create(model="tiny-mla", messages=messages, tools=TOOLS, max_tokens=2)
            assert session.stats[-1].fallback is None
        assert session.stats[-1].rotated_tokens > 0 and client.sessions == [session]
        await client.close()
