"""The proxy benchmark's agent: ``tunnel_agent`` as ``tunnel-agent run`` composes it.

It is :func:`tunnel_agent.cli.run_agent` with one difference: the Kubernetes
API is the benchmark's upstream (``--upstream``, plain HTTP, a fixed bearer
token) rather than a kubeconfig or the in-cluster service account, and there
is no health endpoint. Everything on the tunnel (the connector, the session,
the stream router, :class:`tunnel_agent.kubeproxy.KubeProxy` and its pooled
:class:`tunnel_agent.kubeapi.KubeApi`) is the product's own code.
``--initial-window``, ``--max-frame-size`` and ``--shared-window`` change the protocol limits it
announces, for experiments; 0 keeps the default.

    python -m bench.proxy_agent --server URL --ca FILE --cluster NAME \\
        --credentials-dir DIR [--bootstrap-token TOKEN] --upstream http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from kubernetes_asyncio import client as kube_client

from protocol import kinds
from tunnel_agent.config import AgentSettings, ConnectSettings
from tunnel_agent.connector import Agent
from tunnel_agent.credentials import DirectoryCredentialStore
from tunnel_agent.kubeapi import KubeApi
from tunnel_agent.kubeproxy import KubeProxy
from tunnel_agent.policy import ProxyPolicy
from tunnel_agent.router import StreamRouter
from tunnel_cli import EVENT_LOOPS, freeze_startup_objects, run_main

from .proxy_server import experiment_limits

__all__ = ["main"]

#: What the agent sends the upstream as its own credentials (the upstream ignores it).
AGENT_TOKEN = "Bearer bench-agent-service-account-token"


async def run(args: argparse.Namespace) -> None:
    """Run the agent until SIGTERM or SIGINT."""
    configuration = kube_client.Configuration(host=args.upstream)
    configuration.api_key["BearerToken"] = AGENT_TOKEN
    api = KubeApi(configuration)
    router = StreamRouter()
    proxy = KubeProxy(api, ProxyPolicy())
    router.add(kinds.STREAM_HTTP, proxy.handle)
    settings = AgentSettings(
        server_url=args.server,
        ca_pem=args.ca_pem,
        cluster=args.cluster,
        bootstrap_token=args.bootstrap_token or None,
        credentials_dir=Path(args.credentials_dir),
        connect=ConnectSettings(
            limits=experiment_limits(args.initial_window, args.max_frame_size, args.shared_window),
            backoff_base=0.2,
            backoff_cap=2.0,
        ),
    )
    store = DirectoryCredentialStore(Path(args.credentials_dir))
    agent = Agent(settings, store, on_stream=router)
    freeze_startup_objects()  # as tunnel-agent run does
    task = asyncio.create_task(agent.run(), name="agent")
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, task.cancel)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    finally:
        await proxy.close()
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_agent", description=__doc__)
    parser.add_argument("--server", required=True, help="https://HOST:PORT of the tunnel server")
    parser.add_argument("--ca", required=True, help="the server's CA bundle (PEM file)")
    parser.add_argument("--cluster", required=True, help="the cluster's name on the server")
    parser.add_argument("--credentials-dir", required=True, help="key and certificate directory")
    parser.add_argument("--bootstrap-token", default="", help="one-time token for the first run")
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT of the upstream")
    parser.add_argument("--log-level", default="WARNING", help="log level")
    parser.add_argument("--initial-window", type=int, default=0, help="experiment: stream credit")
    parser.add_argument("--max-frame-size", type=int, default=0, help="experiment: largest frame")
    parser.add_argument(
        "--shared-window", type=int, default=0, help="experiment: credit while shared"
    )
    parser.add_argument("--event-loop", default="auto", choices=list(EVENT_LOOPS))
    args = parser.parse_args(argv)
    args.ca_pem = Path(args.ca).read_bytes()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run_main(run(args), args.event_loop)  # as tunnel-agent run does
    return 0


if __name__ == "__main__":
    sys.exit(main())
