"""The tunnel server: accepts agents, relays kubectl, dispatches commands.

Its packages, one concern each (docs/architecture.md, "Packages and layering"):
``edge`` (the TLS port and callers' connections), ``proxy`` (the kubectl
relay), ``agents`` (agents' sessions, certificates, manifests), ``api`` (the
REST API), ``access`` (tokens and grants), ``commands`` (the durable queue),
``store`` (persistence) and ``ctl`` (``tunnelctl``); ``app`` wires them, and
``context`` is the container the handlers receive.

It may import the shared packages (``protocol``, ``tunnel_mux``, ``tunnel_pki``,
``tunnel_kube``, ``tunnel_cli``, ``tunnel_commands``); it never imports
``tunnel_agent``. pyproject.toml's import-linter contracts check this.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
