"""The agent's probe endpoints, on their own local port.

``/healthz`` answers while the agent runs (liveness); ``/readyz`` answers 200
only while the agent is connected to the server (readiness); ``/metrics`` is
for Prometheus.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .connector import Agent
from .metrics import AgentMetrics

__all__ = ["start_health_server"]

_AGENT: web.AppKey[Agent] = web.AppKey("agent", Agent)
_METRICS: web.AppKey[AgentMetrics] = web.AppKey("metrics", AgentMetrics)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[_METRICS].render(), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    agent = request.app[_AGENT]
    if agent.connected.is_set():
        return web.json_response({"status": "connected", "cluster": agent.settings.cluster})
    return web.json_response(
        {"status": "disconnected", "reason": agent.last_error or "connecting"}, status=503
    )


async def start_health_server(
    agent: Agent, host: str, port: int, metrics: AgentMetrics | None = None
) -> tuple[web.AppRunner, int]:
    """Serve the probes (and /metrics); return the runner and the bound port."""
    app = web.Application()
    app[_AGENT] = agent
    app[_METRICS] = metrics or AgentMetrics(agent)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    # Duck-typed: uvloop's Server is not a subclass of asyncio.Server.
    sockets = getattr(site._server, "sockets", None)
    bound: int = sockets[0].getsockname()[1] if sockets else port
    return runner, bound
