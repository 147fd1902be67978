"""The console's HTML: Jinja2 templates from ``templates/``, always autoescaped."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from tunnel_server import __version__
from tunnel_server.console.fleet import age
from tunnel_server.console.sessions import Viewer
from tunnel_server.console.state import CONSOLE

__all__ = ["STATIC_DIR", "TEMPLATE_DIR", "make_templates", "page"]

TEMPLATE_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"


def make_templates() -> jinja2.Environment:
    """The template environment: autoescaping on for every template, undefined names fail."""
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["age"] = age
    environment.filters["rate"] = rate
    environment.filters["utc"] = utc_text
    environment.globals["server_version"] = __version__
    return environment


def rate(value: float | None) -> str:
    """Bytes per second, in the unit that reads best; "" when unknown."""
    if value is None:
        return ""
    for unit in ("B/s", "KiB/s", "MiB/s"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB/s"


def utc_text(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def page(
    request: web.Request,
    template: str,
    viewer: Viewer | None,
    *,
    status: int = 200,
    **values: Any,
) -> web.Response:
    """``template`` filled for ``viewer``, as an HTML answer."""
    html = (
        request.app[CONSOLE]
        .templates.get_template(template)
        .render(viewer=viewer, path=request.path, **values)
    )
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")
