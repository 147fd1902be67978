"""The HELLO exchange: versions, limits, capabilities, and what may come first."""

from __future__ import annotations

import pytest

from protocol import (
    Connection,
    ConnectionState,
    ErrorCode,
    GoAwayReceived,
    HandshakeCompleted,
    HandshakeIncompleteError,
    Limits,
    MalformedFrameError,
    Side,
    UnsupportedVersionError,
)
from protocol.frames import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HelloFrame,
    MessageFrame,
    OpenFrame,
    PingFrame,
    PongFrame,
    ResetFrame,
    WindowFrame,
)

from .pair import Pair, feed, handshaken, hello, of_type, sent_frames


def test_handshake_settles_on_the_highest_common_version() -> None:
    client = Connection(Side.CLIENT, versions=(1, 3))
    server = Connection(Side.SERVER, versions=(2, 5))
    pair = Pair(client, server, handshake=False)

    client_events, server_events = pair.exchange()

    for connection, events in ((client, client_events), (server, server_events)):
        assert connection.state is ConnectionState.OPEN
        assert connection.version == 3
        [completed] = of_type(events, HandshakeCompleted)
        assert completed.version == 3


def test_handshake_reports_the_peer_limits_and_info() -> None:
    server_limits = Limits(max_frame_size=32 * 1024, max_streams=7)
    client = Connection(Side.CLIENT, info={"cluster": "eu-1"})
    server = Connection(Side.SERVER, server_limits, info={"server": "0.1"})
    pair = Pair(client, server, handshake=False)

    client_events, server_events = pair.exchange()

    [at_client] = of_type(client_events, HandshakeCompleted)
    [at_server] = of_type(server_events, HandshakeCompleted)
    assert at_client.peer_limits == server_limits == client.peer_limits
    assert at_client.peer_info == {"server": "0.1"} == client.peer_info
    assert at_server.peer_limits == Limits() == server.peer_limits
    assert at_server.peer_info == {"cluster": "eu-1"} == server.peer_info


def test_capabilities_are_those_both_sides_announced() -> None:
    client = Connection(Side.CLIENT, capabilities=["exec", "logs", "client-only"])
    server = Connection(Side.SERVER, capabilities=["logs", "exec", "server-only"])
    pair = Pair(client, server, handshake=False)

    client_events, server_events = pair.exchange()

    both = frozenset({"exec", "logs"})
    assert client.capabilities == server.capabilities == both
    assert of_type(client_events, HandshakeCompleted)[0].capabilities == both
    assert of_type(server_events, HandshakeCompleted)[0].capabilities == both


def test_no_capability_in_common_gives_an_empty_set() -> None:
    pair = Pair(
        Connection(Side.CLIENT, capabilities=["a"]), Connection(Side.SERVER, capabilities=["b"])
    )
    assert pair.client.capabilities == pair.server.capabilities == frozenset()


def test_peer_without_a_common_version_is_refused_with_a_goaway() -> None:
    client = Connection(Side.CLIENT, versions=(1, 1))
    server = Connection(Side.SERVER, versions=(2, 3))
    [client_hello] = client.data_to_send()

    with pytest.raises(UnsupportedVersionError) as refused:
        server.receive_data(client_hello, 0.0)

    assert refused.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert server.closed
    assert server.close_code == ErrorCode.UNSUPPORTED_VERSION
    [goaway] = sent_frames(server)
    assert isinstance(goaway, GoAwayFrame)
    assert goaway.code == ErrorCode.UNSUPPORTED_VERSION
    # The reason names both ranges, so an operator knows which side to upgrade.
    assert "1-1" in goaway.reason
    assert "2-3" in goaway.reason
    assert "upgrade" in goaway.reason


def test_refused_peer_reads_the_reason_from_the_goaway() -> None:
    client = Connection(Side.CLIENT, versions=(1, 1))
    server = Connection(Side.SERVER, versions=(2, 3))
    [client_hello] = client.data_to_send()
    with pytest.raises(UnsupportedVersionError):
        server.receive_data(client_hello, 0.0)

    events = [
        event for message in server.data_to_send() for event in client.receive_data(message, 0.0)
    ]

    [goaway] = events
    assert isinstance(goaway, GoAwayReceived)
    assert goaway.code == ErrorCode.UNSUPPORTED_VERSION
    assert "no protocol version in common" in goaway.reason
    assert client.closed
    assert client.close_code == ErrorCode.UNSUPPORTED_VERSION


def test_both_sides_refuse_when_their_hellos_cross() -> None:
    client = Connection(Side.CLIENT, versions=(4, 4))
    server = Connection(Side.SERVER, versions=(1, 2))
    [client_hello] = client.data_to_send()
    [server_hello] = server.data_to_send()

    with pytest.raises(UnsupportedVersionError):
        server.receive_data(client_hello, 0.0)
    with pytest.raises(UnsupportedVersionError):
        client.receive_data(server_hello, 0.0)

    for connection in (client, server):
        [goaway] = sent_frames(connection)
        assert isinstance(goaway, GoAwayFrame)
        assert goaway.code == ErrorCode.UNSUPPORTED_VERSION


_BEFORE_HELLO: list[Frame] = [
    OpenFrame(1, "http", {}),
    DataFrame(1, b"x"),
    ResetFrame(1, ErrorCode.CANCEL),
    WindowFrame(0, 10),
    PingFrame(1),
    PongFrame(1),
    MessageFrame("cert.renew", {}),
]


@pytest.mark.parametrize("frame", _BEFORE_HELLO, ids=lambda frame: type(frame).__name__)
def test_frames_before_hello_are_a_protocol_error(frame: Frame) -> None:
    server = Connection(Side.SERVER)

    with pytest.raises(MalformedFrameError, match="HELLO first"):
        feed(server, frame)

    assert server.closed
    [goaway] = [f for f in sent_frames(server) if isinstance(f, GoAwayFrame)]
    assert goaway.code == ErrorCode.PROTOCOL_ERROR


def test_goaway_during_the_handshake_ends_the_connection() -> None:
    server = Connection(Side.SERVER)

    events = feed(server, GoAwayFrame(0, ErrorCode.INTERNAL_ERROR, "overloaded"))

    assert events == [GoAwayReceived(0, ErrorCode.INTERNAL_ERROR, "overloaded")]
    assert server.closed


def test_a_second_hello_is_a_protocol_error() -> None:
    server = handshaken()

    with pytest.raises(MalformedFrameError, match="HELLO after the handshake"):
        feed(server, hello())

    assert server.closed


def test_commands_wait_for_the_handshake() -> None:
    client = Connection(Side.CLIENT)

    with pytest.raises(HandshakeIncompleteError):
        client.open_stream("http")
    with pytest.raises(HandshakeIncompleteError):
        client.send_message("cert.renew", {})
    with pytest.raises(HandshakeIncompleteError):
        client.send_ping(0.0)


def test_each_side_sends_its_hello_first() -> None:
    for side in Side:
        connection = Connection(side, capabilities=["exec"], info={"pod": "p"})
        [frame] = sent_frames(connection)
        assert isinstance(frame, HelloFrame)
        assert frame.limits == connection.limits
        assert frame.capabilities == frozenset({"exec"})
        assert frame.info == {"pod": "p"}


def test_an_oversized_hello_info_is_refused_locally() -> None:
    with pytest.raises(ValueError, match="HELLO"):
        Connection(Side.CLIENT, info={"blob": "x" * (20 * 1024)})


@pytest.mark.parametrize("versions", [(0, 1), (2, 1), (1, 2**16)])
def test_versions_the_peer_would_refuse_are_refused_locally(versions: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="versions"):
        Connection(Side.CLIENT, versions=versions)


@pytest.mark.parametrize(
    "capabilities", [[f"c{i}" for i in range(65)], ["x" * 65]], ids=["too many", "too long"]
)
def test_capabilities_the_peer_would_refuse_are_refused_locally(capabilities: list[str]) -> None:
    with pytest.raises(ValueError, match="capabilities"):
        Connection(Side.CLIENT, capabilities=capabilities)
