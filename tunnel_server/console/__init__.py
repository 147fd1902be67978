"""The fleet console: web pages served by ``tunnel-server`` on its own port, under ``/ui/``.

A person signs in once with an API token (``sessions``: a server-side session
in the store behind an HttpOnly, Secure, SameSite=Strict cookie; failed
sign-ins limited by ``ratelimit``) and sees the fleet (``fleet``), a cluster,
the commands, the audit trail and, as an admin, users and grants (``pages``);
acts through ``actions``, every change behind a CSRF token and a confirmation,
calling the same functions as the REST API (:mod:`tunnel_server.api.users`,
:mod:`tunnel_server.access`), so one place decides who may do what
(``visibility`` says what a user may see). ``events`` sends the live parts as
Server-Sent Events; ``render`` fills the Jinja2 templates (autoescaped) in
``templates/``; ``headers`` sets a strict Content-Security-Policy: the only
scripts are the static files in ``static/``, served by the server itself.

It may import the shared packages, :mod:`tunnel_server.access`,
:mod:`tunnel_server.api` (the actions and views it shares),
:mod:`tunnel_server.commands` (the command views), ``context``, ``clock``,
``errors`` and the store's interface; the edge, the relay and the agents'
side only through the context. Nothing of the server imports it but ``app``.
"""

from tunnel_server.console.routes import setup_console

__all__ = ["setup_console"]
