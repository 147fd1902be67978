"""The ``tunnel-agent`` command: ``tunnel-agent run``."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import ipaddress
import logging
import signal
import socket
import sys
from pathlib import Path

from protocol import Keepalive, kinds
from protocol.errors import TunnelError
from tunnel_cli import (
    EVENT_LOOPS,
    OnCommandLine,
    configure_logging,
    env_flag,
    freeze_startup_objects,
    parse_duration,
    request_path_build,
    run_main,
)
from tunnel_commands.spec import ALL_COMMAND_TYPES, COMMAND_TYPES
from tunnel_mux import Session
from tunnel_pki.errors import PkiError
from tunnel_pki.names import validate_cluster_name

from . import __version__
from .commands import build_command_runner
from .config import AgentSettings, ConnectSettings
from .connector import Agent
from .credentials import CredentialStore, DirectoryCredentialStore, SecretCredentialStore
from .errors import AgentConfigError, AgentStoppedError
from .executors import subprocess_environment
from .executors.gateway import CommandsGateway
from .executors.jobspec import JobSettings
from .health import start_health_server
from .journal import Journal
from .kubeapi import KubeApi, load_kube_configuration
from .kubeproxy import KubeProxy
from .metrics import AgentMetrics
from .policy import ProxyPolicy
from .router import StreamRouter
from .runner import RunnerSettings

__all__ = ["build_parser", "command_line_warnings", "main", "settings_from_args"]

logger = logging.getLogger("tunnel_agent")

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Said when the bootstrap token comes as a flag (never the token itself).
_PS_SHOWS_THE_FLAG = (
    "--bootstrap-token puts the token on the command line, where anyone on this machine can "
    "read it (ps, /proc); use --bootstrap-token-file or TUNNEL_AGENT_BOOTSTRAP_TOKEN instead"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunnel-agent", description="Reverse-tunnel agent: runs inside a private cluster."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="connect to the server and serve it")
    env = "TUNNEL_AGENT_"
    env_flag(run, "--server", env + "SERVER", help="server URL, https://HOST:PORT")
    env_flag(run, "--ca", env + "CA", help="PEM file of the server CA bundle to pin")
    env_flag(run, "--cluster", env + "CLUSTER", help="this cluster's name on the server")
    env_flag(
        run,
        "--bootstrap-token",
        env + "BOOTSTRAP_TOKEN",
        action=OnCommandLine,
        help="one-time bootstrap token (on the command line, ps shows it: prefer "
        "--bootstrap-token-file or the variable)",
    )
    run.set_defaults(bootstrap_token_on_command_line=False)
    env_flag(
        run,
        "--bootstrap-token-file",
        env + "BOOTSTRAP_TOKEN_FILE",
        help="file holding the bootstrap token",
    )
    env_flag(
        run,
        "--credentials-secret",
        env + "CREDENTIALS_SECRET",
        help="NAMESPACE/NAME of the Secret keeping the key and certificate "
        "(default in a cluster: <namespace>/tunnel-agent-credentials)",
    )
    env_flag(
        run,
        "--credentials-dir",
        env + "CREDENTIALS_DIR",
        help="directory keeping the key and certificate (outside a cluster)",
    )
    env_flag(
        run,
        "--kubeconfig",
        env + "KUBECONFIG",
        help="kubeconfig to reach the Kubernetes API (default: in-cluster)",
    )
    env_flag(
        run,
        "--health-listen",
        env + "HEALTH_LISTEN",
        default="127.0.0.1:8081",
        help="HOST:PORT of /healthz and /readyz ('' to disable)",
    )
    env_flag(
        run,
        "--backoff-cap",
        env + "BACKOFF_CAP",
        default="5m",
        help="longest wait between reconnection attempts",
    )
    env_flag(
        run,
        "--keepalive-interval",
        env + "KEEPALIVE_INTERVAL",
        default="15s",
        help="ping the server after this much silence",
    )
    env_flag(
        run,
        "--keepalive-timeout",
        env + "KEEPALIVE_TIMEOUT",
        default="15s",
        help="reconnect if a ping is not answered within this",
    )
    env_flag(
        run,
        "--keepalive-probe-timeout",
        env + "KEEPALIVE_PROBE_TIMEOUT",
        default="5s",
        help="reconnect if the ping sent with a message after a second of silence "
        "is not answered within this",
    )
    env_flag(
        run,
        "--read-only",
        env + "READ_ONLY",
        action="store_true",
        default=False,
        help="serve only get/list/watch and logs; refuse writes, exec, port-forward",
    )
    env_flag(
        run,
        "--namespaces",
        env + "NAMESPACES",
        default="",
        help="comma-separated namespaces relayed requests may touch (default: all)",
    )
    env_flag(
        run,
        "--allow-secret-values",
        env + "ALLOW_SECRET_VALUES",
        action="store_true",
        default=False,
        help="relay Secret values (withheld by default)",
    )
    env_flag(
        run,
        "--allow-file-git-sources",
        env + "ALLOW_FILE_GIT_SOURCES",
        action="store_true",
        default=False,
        help="let git sources be file:// paths in the agent's own file system "
        "(refused by default; for tests and mounted repositories)",
    )
    env_flag(
        run,
        "--command-types",
        env + "COMMAND_TYPES",
        default=",".join(COMMAND_TYPES),
        help="comma-separated command types this agent runs (default: all)",
    )
    env_flag(
        run,
        "--run-image",
        env + "RUN_IMAGE",
        help="in a cluster: the image of the Jobs that run helm and tofu steps (the agent's "
        "own); without it those steps run in the agent's pod",
    )
    env_flag(
        run,
        "--gateway-listen",
        env + "GATEWAY_LISTEN",
        default="127.0.0.1:0",
        help="HOST:PORT of the commands' gateway (runs' Jobs reach it: the pod's address)",
    )
    env_flag(
        run,
        "--gateway-host",
        env + "GATEWAY_HOST",
        help="the host runs' kubeconfigs name for the gateway (default: its listen host; "
        "listening on every address, this host's own address)",
    )
    env_flag(
        run,
        "--commands-concurrency",
        env + "COMMANDS_CONCURRENCY",
        default="2",
        help="commands run at once (others wait in a queue)",
    )
    env_flag(
        run,
        "--log-format",
        env + "LOG_FORMAT",
        default="text",
        choices=["text", "json"],
        help="log format",
    )
    env_flag(run, "--log-level", env + "LOG_LEVEL", default="info", help="log level")
    env_flag(
        run,
        "--event-loop",
        env + "EVENT_LOOP",
        default="auto",
        choices=list(EVENT_LOOPS),
        help="event loop: uvloop when installed (auto), or force uvloop or asyncio",
    )
    step = commands.add_parser("step", help="run one command step (inside a run's Job)")
    step.add_argument("document", help="the step's document, mounted from its Secret")
    return parser


def settings_from_args(args: argparse.Namespace) -> AgentSettings:
    if not args.server:
        raise AgentConfigError("no server: give --server or TUNNEL_AGENT_SERVER")
    if not args.ca:
        raise AgentConfigError("no CA bundle to pin: give --ca or TUNNEL_AGENT_CA")
    if not args.cluster:
        raise AgentConfigError("no cluster name: give --cluster or TUNNEL_AGENT_CLUSTER")
    try:
        cluster = validate_cluster_name(args.cluster)
    except PkiError as exc:
        raise AgentConfigError(str(exc)) from exc
    ca_pem = _read(args.ca, "the CA bundle")
    token = args.bootstrap_token
    if not token and args.bootstrap_token_file:
        token = _read(args.bootstrap_token_file, "the bootstrap token").decode().strip() or None
    secret = None
    if args.credentials_secret:
        namespace, _, name = str(args.credentials_secret).partition("/")
        if not namespace or not name:
            raise AgentConfigError("--credentials-secret must be NAMESPACE/NAME")
        secret = (namespace, name)
    credentials_dir = Path(args.credentials_dir) if args.credentials_dir else None
    if secret is None and credentials_dir is None:
        namespace_file = _SERVICE_ACCOUNT / "namespace"
        if not namespace_file.exists():
            raise AgentConfigError(
                "outside a cluster, give --credentials-dir (or --credentials-secret)"
            )
        secret = (namespace_file.read_text().strip(), "tunnel-agent-credentials")
    health = None
    if args.health_listen:
        host, _, port = str(args.health_listen).rpartition(":")
        if not port.isdigit():
            raise AgentConfigError("--health-listen must be HOST:PORT")
        health = (host or "127.0.0.1", int(port))
    gateway_host, _, gateway_port = str(args.gateway_listen).rpartition(":")
    if not gateway_port.isdigit():
        raise AgentConfigError("--gateway-listen must be HOST:PORT")
    return AgentSettings(
        server_url=str(args.server).rstrip("/"),
        ca_pem=ca_pem,
        cluster=cluster,
        bootstrap_token=token,
        credentials_secret=secret,
        credentials_dir=credentials_dir,
        kubeconfig=Path(args.kubeconfig) if args.kubeconfig else None,
        health_listen=health,
        commands_concurrency=_positive_int(args.commands_concurrency, "--commands-concurrency"),
        command_types=_command_types(str(args.command_types)),
        allow_file_git_sources=bool(args.allow_file_git_sources),
        run_image=args.run_image or None,
        gateway_listen=(gateway_host or "127.0.0.1", int(gateway_port)),
        gateway_host=args.gateway_host or None,
        proxy=ProxyPolicy(
            read_only=bool(args.read_only),
            namespaces=frozenset(n.strip() for n in str(args.namespaces).split(",") if n.strip()),
            allow_secret_values=bool(args.allow_secret_values),
        ),
        connect=ConnectSettings(
            backoff_cap=parse_duration(args.backoff_cap).total_seconds(),
            keepalive=Keepalive(
                interval=parse_duration(args.keepalive_interval).total_seconds(),
                timeout=parse_duration(args.keepalive_timeout).total_seconds(),
                probe_timeout=parse_duration(args.keepalive_probe_timeout).total_seconds(),
            ),
        ),
    )


def command_line_warnings(args: argparse.Namespace) -> list[str]:
    """What to warn of in how the agent was started: secrets given as flags."""
    given = args.bootstrap_token_on_command_line and args.bootstrap_token
    return [_PS_SHOWS_THE_FLAG] if given else []


def _positive_int(value: object, flag: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if not 1 <= number <= 64:
        raise AgentConfigError(f"{flag} must be a whole number from 1 to 64, not {value!r}")
    return number


def _command_types(value: str) -> frozenset[str]:
    types = frozenset(name.strip() for name in value.split(",") if name.strip())
    unknown = sorted(types - ALL_COMMAND_TYPES)
    if unknown or not types:
        raise AgentConfigError(
            f"--command-types takes a list of {', '.join(COMMAND_TYPES)}, not {value[:100]!r}"
        )
    return types


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise AgentConfigError(f"cannot read {what} from {path}: {exc.strerror}") from exc


async def run_agent(settings: AgentSettings) -> None:
    """Run the agent, its command runner and its health endpoint until a signal."""
    logger.info("request path %s", request_path_build())
    kube = KubeApi(await load_kube_configuration(settings.kubeconfig))
    store: CredentialStore
    if settings.credentials_dir is not None:
        store = DirectoryCredentialStore(settings.credentials_dir)
        namespace = "default"
    else:
        assert settings.credentials_secret is not None
        store = SecretCredentialStore(kube.api_client(), *settings.credentials_secret)
        namespace = settings.credentials_secret[0]
    proxy = KubeProxy(kube, settings.proxy)
    gateway = CommandsGateway(
        kube,
        host=settings.gateway_listen[0],
        port=settings.gateway_listen[1],
        advertised=settings.gateway_host or _own_address(settings.gateway_listen[0]),
    )
    jobs = None
    if settings.run_image is not None and settings.credentials_secret is not None:
        # In a cluster: helm and tofu run as Jobs, away from the agent's token.
        jobs = JobSettings(
            settings.run_image,
            namespace,
            environment=tuple(
                (name, value)
                for name, value in subprocess_environment().items()
                if name not in ("PATH", "HOME")
            ),
        )
    runner = build_command_runner(
        kube,
        Journal(store),
        gateway=gateway,
        namespace=namespace,
        kubeconfig=settings.kubeconfig,
        settings=RunnerSettings(concurrency=settings.commands_concurrency),
        read_only=settings.proxy.read_only,
        command_types=settings.command_types,
        masked_values=(settings.bootstrap_token,) if settings.bootstrap_token else (),
        # In a cluster, the agent's namespace (its Secrets) is out of commands' reach.
        own_namespace=None if settings.credentials_secret is None else namespace,
        allow_file_git_sources=settings.allow_file_git_sources,
        jobs=jobs,
    )
    if settings.allow_file_git_sources:
        logger.warning("git sources may be file:// paths in this pod (--allow-file-git-sources)")
    router = StreamRouter()
    router.add(kinds.STREAM_HTTP, proxy.handle)
    router.add(kinds.STREAM_COMMAND, runner.handle_offer)
    current: list[Session] = []

    def connected(session: Session) -> None:
        current[:] = [session]
        runner.connected(session)

    def disconnected() -> None:
        runner.disconnected()
        for session in current:
            metrics.sessions.retire(session)
        current.clear()

    agent = Agent(
        settings,
        store,
        on_stream=router,
        on_message=runner.on_message,
        on_connected=connected,
        on_disconnected=disconnected,
    )
    version = await kube.kubernetes_version()
    if version is not None:
        agent.facts[kinds.INFO_KUBERNETES_VERSION] = version
    else:
        logger.warning("the API server did not say its version; the server will not show it")
    metrics = AgentMetrics(agent, proxy, runner)
    # The command executors use kubernetes_asyncio's client (tens of thousands
    # of objects); loaded now, the freeze covers it.
    importlib.import_module("kubernetes_asyncio.client")
    freeze_startup_objects()
    health = None
    if settings.health_listen is not None:
        health, port = await start_health_server(agent, *settings.health_listen, metrics)
        logger.info("health endpoints on %s:%d", settings.health_listen[0], port)
    tasks = [
        asyncio.create_task(agent.run(), name="agent"),
        asyncio.create_task(runner.run(), name="command runner"),
    ]
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, tasks[0].cancel)
    try:
        # The agent's loop ends the whole: a signal, or a stop a person must fix.
        await asyncio.wait([tasks[0]])
        if not tasks[0].cancelled():
            tasks[0].result()  # re-raises why the agent stopped
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await gateway.close()
        if health is not None:
            await health.cleanup()
        await proxy.close()
        await kube.close()


def _own_address(listen: str) -> str | None:
    """This host's address, for a gateway listening on every address (a pod's: /etc/hosts)."""
    try:
        unspecified = ipaddress.ip_address(listen).is_unspecified
    except ValueError:
        return None  # a host name: the one runs are told
    if not unspecified:
        return None
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        raise AgentConfigError(
            f"cannot find this host's address for the commands' gateway: {exc}; give --gateway-host"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tunnel-agent``."""
    args = build_parser().parse_args(argv)
    if args.command == "step":
        from .executors.jobstep import main as step_main

        return step_main([args.document])
    try:
        configure_logging(args.log_format, args.log_level)
        for warning in command_line_warnings(args):
            logger.warning("%s", warning)
        run_main(run_agent(settings_from_args(args)), args.event_loop)
    except AgentStoppedError as exc:
        logger.error("stopping: %s", exc)
        return 3
    except TunnelError as exc:
        print(f"tunnel-agent: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
