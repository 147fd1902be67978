"""The stream transition table, walked pair by pair through a real connection.

Every (StreamState, StreamInput) pair is tried: allowed pairs must land in the
state the table names; a missing local input raises StreamStateError and
sends nothing; a missing remote input resets the stream with STREAM_CLOSED.
A stream that reached RESET (or CLOSED with nothing left to send) is no longer
tracked, so for it the connection's rule for ended streams applies instead:
local commands name an unknown stream, a reset does nothing, and frames that
crossed on the wire are dropped (docs/protocol.md, "Stream states").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    Connection,
    ErrorCode,
    StreamReset,
    StreamState,
    StreamStateError,
    UnknownStreamError,
)
from protocol.events import Event
from protocol.frames import DataFrame, ResetFrame
from protocol.streams import TERMINAL_STATES, TRANSITIONS, StreamInput, next_state

from .pair import Pair, assert_accounted, data_frames, feed, of_type, sent_frames

ALL_PAIRS = [(state, stream_input) for state in StreamState for stream_input in StreamInput]


def open_stream(local: bool = True) -> tuple[Pair, int]:
    """A pair with one stream, seen from the client; ``local`` if the client opened it."""
    pair = Pair()
    opener = pair.client if local else pair.server
    stream_id = opener.open_stream("http")
    pair.exchange()
    return pair, stream_id


def drive_to(state: StreamState, local: bool = True) -> tuple[Pair, int]:
    """A pair whose client holds a stream in ``state``."""
    pair, stream_id = open_stream(local)
    if state is StreamState.HALF_CLOSED_LOCAL:
        pair.client.end_stream(stream_id)
        pair.exchange()
    elif state is StreamState.HALF_CLOSED_REMOTE:
        pair.server.end_stream(stream_id)
        pair.exchange()
    elif state is StreamState.CLOSED:
        # CLOSED is held only while this side's own END waits to be sent.
        pair.server.end_stream(stream_id)
        pair.exchange()
        pair.client.end_stream(stream_id)
    elif state is StreamState.RESET:
        pair.client.reset_stream(stream_id)
        pair.exchange()
    return pair, stream_id


def apply(connection: Connection, stream_id: int, stream_input: StreamInput) -> list[Event]:
    """Give the stream one input, by command or as a frame from the peer."""
    if stream_input is StreamInput.SEND_DATA:
        connection.send_data(stream_id, b"x")
    elif stream_input is StreamInput.SEND_END:
        connection.end_stream(stream_id)
    elif stream_input is StreamInput.SEND_RESET:
        connection.reset_stream(stream_id, ErrorCode.CANCEL, "local")
    elif stream_input is StreamInput.RECV_DATA:
        return feed(connection, DataFrame(stream_id, b"x"))
    elif stream_input is StreamInput.RECV_END:
        return feed(connection, DataFrame(stream_id, b"", end_stream=True))
    else:
        return feed(connection, ResetFrame(stream_id, ErrorCode.CANCEL, "remote"))
    return []


def test_the_table_covers_each_state_and_lets_every_stream_end() -> None:
    assert {state for state, _ in TRANSITIONS} == set(StreamState) - {StreamState.RESET}
    for state in set(StreamState) - TERMINAL_STATES:
        assert next_state(state, StreamInput.SEND_RESET) is StreamState.RESET
        assert next_state(state, StreamInput.RECV_RESET) is StreamState.RESET
    assert all(next_state(StreamState.RESET, i) is None for i in StreamInput)


@pytest.mark.parametrize(
    ("state", "stream_input"),
    ALL_PAIRS,
    ids=[f"{state.name}-{stream_input.name}" for state, stream_input in ALL_PAIRS],
)
def test_every_state_and_input_pair_follows_the_table(
    state: StreamState, stream_input: StreamInput
) -> None:
    pair, stream_id = drive_to(state)
    client = pair.client
    expected = next_state(state, stream_input)
    before = replace(client.stats)

    if state is StreamState.RESET:
        # Ended and forgotten: the table has no row, the rule for ended streams applies.
        assert client.stream_state(stream_id) is None
        if stream_input in (StreamInput.SEND_DATA, StreamInput.SEND_END):
            with pytest.raises(UnknownStreamError):
                apply(client, stream_id, stream_input)
        else:
            assert apply(client, stream_id, stream_input) == []
        assert of_type(sent_frames(client), ResetFrame) == []
        assert client.stats.streams_reset == before.streams_reset
        return

    assert client.stream_state(stream_id) is state
    # Only CLOSED has a frame still queued: this side's own END.
    queued = [DataFrame(stream_id, b"", end_stream=True)] if state is StreamState.CLOSED else []

    if expected is None and stream_input.is_local:
        with pytest.raises(StreamStateError):
            apply(client, stream_id, stream_input)
        assert client.stream_state(stream_id) is state
        assert data_frames(sent_frames(client), stream_id) == queued
    elif expected is None:
        events = apply(client, stream_id, stream_input)
        [reset] = of_type(events, StreamReset)
        assert (reset.stream_id, reset.code, reset.remote) == (
            stream_id,
            ErrorCode.STREAM_CLOSED,
            False,
        )
        assert client.stream_state(stream_id) is None
        frames = sent_frames(client)
        assert ResetFrame(stream_id, ErrorCode.STREAM_CLOSED, reset.reason) in frames
        assert data_frames(frames, stream_id) == []
        assert client.stats.streams_reset == before.streams_reset + 1
    else:
        apply(client, stream_id, stream_input)
        if expected in TERMINAL_STATES:
            sent_frames(client)  # an END still queued must go before the stream is let go
            assert client.stream_state(stream_id) is None
            if expected is StreamState.CLOSED:
                assert client.stats.streams_closed == before.streams_closed + 1
            else:
                assert client.stats.streams_reset == before.streams_reset + 1
        else:
            assert client.stream_state(stream_id) is expected
    assert_accounted(client)


@dataclass
class Model:
    """What the table says about one stream, beside what the connection says."""

    state: StreamState | None = StreamState.OPEN  # None once the stream is let go
    end_queued: bool = False

    def expect(self, stream_input: StreamInput) -> StreamState | None:
        assert self.state is not None
        return next_state(self.state, stream_input)


#: An input, or None: the I/O layer takes what the connection has to send.
Step = StreamInput | None

WALK = settings(max_examples=500, deadline=None, derandomize=True, database=None)


@WALK
@given(
    local=st.booleans(),
    steps=st.lists(st.one_of(st.none(), st.sampled_from(StreamInput)), max_size=12),
)
def test_random_walks_through_the_table_agree_with_the_connection(
    local: bool, steps: list[Step]
) -> None:
    pair, stream_id = open_stream(local)
    client = pair.client
    model = Model()

    for step in steps:
        if step is None:
            sent_frames(client)
            if model.end_queued:
                model.end_queued = False
                if model.state is StreamState.CLOSED:
                    model.state = None
        elif model.state is None:
            if step in (StreamInput.SEND_DATA, StreamInput.SEND_END):
                with pytest.raises(UnknownStreamError):
                    apply(client, stream_id, step)
            else:
                assert apply(client, stream_id, step) == []
        elif (expected := model.expect(step)) is None and step.is_local:
            with pytest.raises(StreamStateError):
                apply(client, stream_id, step)
        elif expected is None:
            [reset] = of_type(apply(client, stream_id, step), StreamReset)
            assert reset.code == ErrorCode.STREAM_CLOSED
            model.state = None
        else:
            apply(client, stream_id, step)
            model.state = expected
            if step is StreamInput.SEND_END:
                model.end_queued = True
            if expected is StreamState.RESET or (
                expected is StreamState.CLOSED and not model.end_queued
            ):
                model.state = None
        assert client.stream_state(stream_id) is model.state
        assert_accounted(client)
