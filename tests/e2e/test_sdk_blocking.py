"""The blocking client for real: ``Leyline`` (an ``openai.OpenAI``): sessions, sync_edits, blocks, close."""

from __future__ import annotations

import openai
import pytest

from examples.trace import SYSTEM, TASK, TOOLS, agent_turn
from leyline_policies import TruncateOlderThanN
from leyline_sdk import Leyline
from tests.e2e.server_helpers import make_service, running_server


def test_blocking_sessions_splice_sync_edits_blocks_and_close():
    with running_server(make_service(kv_budget_mb=32)) as url:
        client = Leyline(base_url=url + "/v1", policies=[TruncateOlderThanN(2)])
        assert isinstance(client, openai.OpenAI)
        session = client.session(tools=TOOLS)
        messages = [SYSTEM, TASK]
        for turn in range(4):
            r = session.create(model="tiny-mla", messages=messages, max_tokens=2)
            assert r.leyline["session_id"] == session.session_id
            messages += agent_turn(turn)
        assert session.stats[-1].fallback is None and session.stats[-1].rotated_tokens > 0
        session.history = list(messages)  # the agent appended its turn; the tool still runs
        spliced = session.sync_edits()
        assert spliced is not None and spliced.fallback is None and spliced.directives > 0
        with session.create(model="tiny-mla", messages=messages, max_tokens=2, stream=True) as stream:
            assert isinstance(stream, openai.Stream) and list(stream)
        assert session.stats[-1].fallback is None and client.sessions == [session]

        block = client.blocks.create(tokens=[5, 6, 7])
        assert client.blocks.retrieve(block.id).tokens == [5, 6, 7]
        client.blocks.delete(block.id)
        with pytest.raises(openai.NotFoundError):
            client.blocks.retrieve(block.id)

        session_id = session.session_id
        client.close()  # deletes the server-side sessions
        probe = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        with pytest.raises(openai.NotFoundError):
            probe.get(f"/leyline/sessions/{session_id}", cast_to=object)
        assert session.session_id is None and len(session.stats) == 6  # still readable
