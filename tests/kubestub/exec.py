"""``pods/exec`` over WebSockets: the ``v5.channel.k8s.io`` and ``v4.channel.k8s.io`` protocols.

Every binary message starts with a channel byte: 0 stdin, 1 stdout, 2 stderr,
3 the error channel (one ``metav1.Status`` at the end: Success, or Failure
with reason ``NonZeroExitCode`` and the exit code as a cause), 4 terminal
resize. v5 adds channel 255: ``[255, 0]`` closes stdin, which is how
``kubectl exec -i ... -- cat`` ends. The exec is a real HTTP/1.1 101 upgrade;
SPDY upgrade requests are refused with a 400 Status that says so, and
kubectl 1.32 never needs them because the WebSocket upgrade succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import WSMsgType, web

from tests.kubestub.commands import CommandNotFoundError, Process, Stdin, run_command
from tests.kubestub.logs import pick_container
from tests.kubestub.state import ClusterState
from tests.kubestub.status import bad_request

__all__ = ["EXEC_PROTOCOLS", "serve_exec", "upgrade_websocket"]

logger = logging.getLogger(__name__)

EXEC_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
"""The remote-command subprotocols served, most preferred first."""

STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
_CHUNK = 32 * 1024
_STDIN_QUEUE = 16


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


async def upgrade_websocket(
    request: web.Request, state: ClusterState, protocols: tuple[str, ...], what: str
) -> web.WebSocketResponse:
    """Upgrade to a WebSocket speaking one of ``protocols`` (400 Status if the request cannot)."""
    upgrade = request.headers.get("Upgrade", "").lower()
    if upgrade != "websocket":
        if "spdy" in upgrade:
            raise bad_request(
                f"{what} over SPDY is not supported by this server: upgrade to a WebSocket "
                f"with one of the subprotocols {', '.join(protocols)}"
            )
        raise bad_request("Upgrade request required")
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    if not any(p in protocols for p in offered):
        raise bad_request(
            f"none of the offered subprotocols ({', '.join(o for o in offered if o) or 'none'}) "
            f"is supported: use one of {', '.join(protocols)}"
        )
    socket = web.WebSocketResponse(
        protocols=protocols,
        max_msg_size=state.settings.max_ws_message,
        heartbeat=30.0,
        compress=False,
    )
    await socket.prepare(request)
    state.sockets.add(socket)
    return socket


def _status(code: int | None, argv: list[str], error: str = "") -> dict[str, Any]:
    """The error-channel Status for how the command ended."""
    if error:
        return {
            "metadata": {},
            "status": "Failure",
            "message": f"Internal error occurred: {error}",
            "reason": "InternalError",
            "details": {"causes": [{"message": error}]},
            "code": 500,
        }
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": (
            "command terminated with non-zero exit code: error executing command "
            f"[{' '.join(argv)}], exit code {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def _environment(pod: dict[str, Any], container: str, tty: bool) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME": pod["metadata"]["name"],
    }
    if tty:
        env["TERM"] = "xterm"
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            for item in spec.get("env") or []:
                if isinstance(item, dict) and "value" in item:
                    env[str(item.get("name"))] = str(item["value"])
    env.update(
        {
            "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_PORT": "tcp://10.96.0.1:443",
            "HOME": "/root",
        }
    )
    return env


def _main_process(pod: dict[str, Any], container: str) -> list[str]:
    """What ``attach`` attaches to: the container's command and args, or a shell."""
    for spec in (pod.get("spec") or {}).get("containers") or []:
        if spec.get("name") == container:
            argv = list(spec.get("command") or []) + list(spec.get("args") or [])
            return argv or ["sh"]
    return ["sh"]


async def serve_exec(
    request: web.Request, state: ClusterState, pod: dict[str, Any], *, attach: bool = False
) -> web.StreamResponse:
    """Run a fake command in ``pod``, streaming its stdio over the WebSocket.

    ``attach`` runs the container's own command instead of the ``command``
    parameters (each attach starts it afresh: there is no long-lived process).
    """
    container = pick_container(pod, request.query.get("container"))
    argv = _main_process(pod, container) if attach else request.query.getall("command", [])
    want_stdin, want_stdout = _flag(request, "stdin"), _flag(request, "stdout")
    want_stderr, tty = _flag(request, "stderr"), _flag(request, "tty")
    if not argv:
        raise bad_request("you must specify at least one command for the container")
    if not (want_stdin or want_stdout or want_stderr):
        raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
    if tty and want_stderr:
        raise bad_request("tty and stderr cannot both be true")
    socket = await upgrade_websocket(request, state, EXEC_PROTOCOLS, "exec")
    v5 = socket.ws_protocol == "v5.channel.k8s.io"
    stdin_queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_STDIN_QUEUE)
    gone = asyncio.Event()

    async def send(channel: int, data: bytes) -> None:
        if tty and channel in (STDOUT, STDERR):
            data = data.replace(b"\n", b"\r\n")
            channel = STDOUT
        for start in range(0, len(data), _CHUNK):
            await socket.send_bytes(bytes([channel]) + data[start : start + _CHUNK])

    async def stdout(data: bytes) -> None:
        if want_stdout and data:
            await send(STDOUT, data)

    async def stderr(data: bytes) -> None:
        if (want_stderr or tty) and data:
            await send(STDERR, data)

    reader = asyncio.create_task(_read_client(socket, stdin_queue, gone, v5, want_stdin))
    uid = pod["metadata"]["uid"]
    process = Process(
        argv=argv,
        files=state.files.of(uid, pod["metadata"]["name"]),
        stdin=Stdin(stdin_queue) if want_stdin else Stdin(),
        stdout=stdout,
        stderr=stderr,
        env=_environment(pod, container, tty),
        tty=tty,
    )
    running = asyncio.create_task(run_command(process))
    waiting = asyncio.create_task(gone.wait())
    try:
        await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if running.done():
            try:
                status = _status(running.result(), argv)
            except CommandNotFoundError as exc:
                status = _status(
                    None,
                    argv,
                    "error executing command in container: failed to exec in container: failed "
                    "to start exec: OCI runtime exec failed: exec failed: unable to start "
                    f'container process: exec: "{exc}": executable file not found in $PATH: '
                    "unknown",
                )
            await socket.send_bytes(bytes([ERROR]) + json.dumps(status).encode())
            await socket.close()
        # Otherwise the client went away: the process is killed, as the kubelet kills it.
    except ConnectionResetError:
        pass  # The client went away mid-stream: there is no one left to answer.
    finally:
        for task in (running, waiting, reader):
            task.cancel()
        for task in (running, waiting, reader):
            with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                await task
        state.sockets.discard(socket)
    return socket


async def _read_client(
    socket: web.WebSocketResponse,
    stdin: asyncio.Queue[bytes | None],
    gone: asyncio.Event,
    v5: bool,
    want_stdin: bool,
) -> None:
    """Demultiplex what the client sends: stdin data, stdin close, resizes."""
    stdin_open = want_stdin
    try:
        async for message in socket:
            if message.type != WSMsgType.BINARY or not message.data:
                continue
            channel, payload = message.data[0], message.data[1:]
            if channel == STDIN and stdin_open and payload:
                await stdin.put(bytes(payload))
            elif channel == CLOSE and v5 and payload[:1] == bytes([STDIN]) and stdin_open:
                stdin_open = False
                await stdin.put(None)
            elif channel == RESIZE:
                logger.debug("terminal resized: %s", bytes(payload)[:64])
    finally:
        if stdin_open:
            with contextlib.suppress(asyncio.QueueFull):
                stdin.put_nowait(None)
        gone.set()
