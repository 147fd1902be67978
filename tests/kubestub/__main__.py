"""Run the stand-in standalone: ``python -m tests.kubestub --port N --kubeconfig-out FILE``.

It serves until interrupted, with the pods given by ``--pod`` (default one,
``demo``) running in the ``default`` namespace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from tests.kubestub.server import KubeStub


async def serve(host: str, port: int, kubeconfig: Path | None, pods: list[str]) -> None:
    """Serve until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with KubeStub(host=host, port=port) as stub:
        for pod in pods:
            stub.add_pod(pod)
        if kubeconfig is not None:
            stub.write_kubeconfig(kubeconfig)
        print(f"kubestub serving on {stub.url}", flush=True)
        if kubeconfig is not None:
            print(f"kubeconfig written to {kubeconfig}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and serve."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.kubestub", description="A stand-in Kubernetes API server."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig for it here")
    parser.add_argument(
        "--pod", action="append", help="a running pod to create in 'default' (repeatable)"
    )
    parser.add_argument("--log-level", default="WARNING", help="logging level")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.kubeconfig_out, args.pod or ["demo"]))


if __name__ == "__main__":
    main()
