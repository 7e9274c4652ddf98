"""LangChain's ``ChatOpenAI`` with Leyline's clients, for real: invoke, stream, ainvoke, astream, bind_tools.

``ChatOpenAI`` takes openai's ``chat.completions`` resources as ``client`` / ``async_client`` (and
the clients themselves as ``root_client`` / ``root_async_client``, for its structured-output and
``stream()`` paths); Leyline's are openai's, with sessions. A conversation with old tool results
(``ToolMessage``s) is spliced turn after turn, found by its message prefix.
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from leyline_policies import TruncateOlderThanN
from leyline_sdk import AsyncLeyline, Leyline
from tests.frameworks.conftest import KEY, MODEL


@tool
def read_file(path: str) -> str:
    """Read a source file."""
    return f"# {path}\n" + "".join(f"value_{i} = {i * i}\n" for i in range(60))


def chat_model(server: str) -> tuple[ChatOpenAI, Leyline, AsyncLeyline]:
    sync = Leyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    aclient = AsyncLeyline(base_url=server, api_key=KEY, policies=[TruncateOlderThanN(2)])
    llm = ChatOpenAI(
        model=MODEL,
        client=sync.chat.completions,
        async_client=aclient.chat.completions,
        root_client=sync,
        root_async_client=aclient,
        max_tokens=4,
        api_key=KEY,
    )
    return llm, sync, aclient


def history(reads: int) -> list[BaseMessage]:
    """A conversation whose agent read ``reads`` files, one call per turn."""
    messages: list[BaseMessage] = [SystemMessage("You fix bugs."), HumanMessage("Find where value_7 is set.")]
    for i in range(reads):
        call = {"name": "read_file", "args": {"path": f"src/m{i}.py"}, "id": f"call_{i}"}
        messages.append(AIMessage("", tool_calls=[call]))
        messages.append(ToolMessage(read_file.invoke(call["args"]), tool_call_id=f"call_{i}"))
    return messages


def assert_spliced(sessions: list, evicting_turns: int) -> None:
    (session,) = sessions
    assert all(s.fallback is None for s in session.stats), [s.fallback for s in session.stats]
    evicting = [s for s in session.stats[1:] if s.cleared]
    assert len(evicting) >= evicting_turns and all(s.rotated_tokens > 0 for s in evicting)


def test_invoke_and_stream_continue_one_spliced_session(server):
    llm, sync, aclient = chat_model(server)
    messages = history(5)
    for turn in range(3):
        messages.append(HumanMessage(f"And src/t{turn}.py?"))
        if turn % 2 == 0:
            reply = llm.invoke(messages)
        else:
            chunks = list(llm.stream(messages))
            reply = sum(chunks[1:], start=chunks[0])
        assert isinstance(reply, AIMessage) and reply.response_metadata.get("finish_reason") in ("stop", "length")
        messages.append(AIMessage(reply.content))
    assert_spliced(sync.sessions, evicting_turns=2)
    sync.close()


async def test_ainvoke_and_astream_continue_one_spliced_session(server):
    llm, sync, aclient = chat_model(server)
    messages = history(5)
    for turn in range(3):
        messages.append(HumanMessage(f"And src/t{turn}.py?"))
        if turn % 2 == 0:
            reply = await llm.ainvoke(messages)
        else:
            chunks = [chunk async for chunk in llm.astream(messages)]
            reply = sum(chunks[1:], start=chunks[0])
        assert reply.response_metadata.get("finish_reason") in ("stop", "length")
        messages.append(AIMessage(reply.content))
    assert_spliced(aclient.sessions, evicting_turns=2)
    await aclient.close()


def test_bind_tools_sends_the_tools_and_keeps_the_session(server):
    llm, sync, _ = chat_model(server)
    bound = llm.bind_tools([read_file])
    messages = history(5)
    for turn in range(2):
        messages.append(HumanMessage(f"And src/t{turn}.py?"))
        reply = bound.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(AIMessage(reply.content))
    (session,) = sync.sessions
    assert session.stats[-1].fallback is None and session.stats[-1].directives > 0
    sync.close()
