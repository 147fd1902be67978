"""What the console keeps for the life of the application, under one app key."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import jinja2
from aiohttp import web

from tunnel_server.console.fleet import TrafficSampler
from tunnel_server.console.ratelimit import FailedSignIns

__all__ = ["CONSOLE", "ConsoleState"]


@dataclass(slots=True)
class ConsoleState:
    templates: jinja2.Environment
    #: How long a sign-in lasts (never past the API token it was made with).
    session_ttl: timedelta = timedelta(hours=8)
    #: How long the token of a kubeconfig downloaded from the console lives, by default.
    kubeconfig_ttl: str = "1h"
    #: Seconds between two looks at the fleet for each viewer's live updates.
    poll_interval: float = 1.0
    failures: FailedSignIns = field(default_factory=FailedSignIns)
    traffic: TrafficSampler = field(default_factory=TrafficSampler)


CONSOLE: web.AppKey[ConsoleState] = web.AppKey("console", ConsoleState)
