"""relayrl.threads.to_thread: once the await returns, the call's arguments and result are held by
nobody but the caller (asyncio.to_thread still held every result and 1 in 5 arguments here), so a
caller that lets go of a buffer frees it then."""

import threading
import weakref

import pytest

from relayrl.threads import to_thread


class Buffer:
    pass


def _same(buffer: Buffer) -> Buffer:
    return buffer


def _nothing(buffer: Buffer) -> None:
    return None


async def test_the_result_and_the_arguments_are_let_go_when_the_caller_lets_go():
    for _ in range(200):
        buffer = Buffer()
        gone = weakref.ref(buffer)
        back = await to_thread(_same, buffer)
        assert back is buffer
        del buffer, back
        assert gone() is None
        buffer = Buffer()
        gone = weakref.ref(buffer)
        assert await to_thread(_nothing, buffer) is None
        del buffer
        assert gone() is None


async def test_an_error_in_the_thread_reaches_the_caller():
    def fails() -> None:
        raise ValueError("in the thread")

    with pytest.raises(ValueError, match="in the thread"):
        await to_thread(fails)


async def test_the_call_runs_off_the_event_loops_thread():
    assert await to_thread(threading.get_ident) != threading.get_ident()
