"""Running the commands the server sends, and reporting on them.

An offer arrives on a ``command`` stream: the agent validates the spec,
refuses an attempt it has already accepted (so none runs twice), answers
``busy`` when its queue is full, and otherwise accepts. Accepted commands run
at most ``concurrency`` at a time. Each keeps a report stream to the server
while connected: start, log lines as they come, heartbeats, and the result,
which the agent keeps (in its journal) until the server acknowledges it.
After a reconnect every unfinished or unacknowledged command reports again.
A ``command.cancel`` message stops a run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import kinds
from protocol.errors import ErrorCode, LocalProtocolError, MalformedFrameError
from protocol.records import MAX_RECORD, RecordReader, encode_record
from tunnel_mux import MuxStream, Session, SessionError

from .identity import AGENT, RunIdentity, identity_from_offer
from .journal import Journal

__all__ = ["CommandRunner", "Job", "RunnerSettings"]

logger = logging.getLogger(__name__)

#: ``execute(spec, job_context) -> result`` where result is the record sent
#: to the server: ``{"outcome", "summary", "outputs", "error"}``.
Executor = Callable[[dict[str, Any], "JobContext"], Awaitable[dict[str, Any]]]
#: ``validate(spec) -> None`` or raises ValueError with a message naming the field.
Validator = Callable[[dict[str, Any]], None]

_MAX_SPEC = 2 * 1024 * 1024


#: Seconds before a report the server failed is made again on the same session (at most).
REPORT_RETRY = 2.0


@dataclass(frozen=True, slots=True)
class RunnerSettings:
    concurrency: int = 2
    queue_limit: int = 64
    heartbeat: float = 10.0
    #: Log lines held while they cannot be sent; older ones are dropped.
    max_pending_log_lines: int = 5000
    max_line: int = 4096
    workroot: Path | None = None


@dataclass(slots=True)
class JobContext:
    """What an executor gets besides the spec."""

    command_id: str
    attempt: int
    workdir: Path
    log: Callable[[str], None]
    #: Whom the command acts as in the cluster (from the server's offer).
    identity: RunIdentity = AGENT


@dataclass(eq=False, slots=True)
class Job:
    id: str
    attempt: int
    type: str
    name: str
    spec: dict[str, Any]
    timeout: float
    identity: RunIdentity = AGENT
    state: str = "queued"  # queued, running, finished
    result: dict[str, Any] | None = None
    cancel_requested: bool = False
    task: asyncio.Task[None] | None = None
    logs: deque[str] = field(default_factory=deque)
    dropped_lines: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    reporting: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.attempt)


#: The most a log record's lines may take, counted as JSON may write them at
#: worst (six characters for a control character): well within MAX_RECORD.
LOG_BATCH_BUDGET = MAX_RECORD // 2


def log_batches(lines: list[str]) -> Iterator[list[str]]:
    """``lines`` in batches that each fit one record, in order.

    One record of them all could exceed MAX_RECORD (many lines gathered while
    disconnected): it failed to encode, the report stopped, the command's
    lease lapsed, and the server offered it again, to run a second time.
    """
    batch: list[str] = []
    size = 0
    for line in lines:
        cost = 6 * len(line) + 8
        if batch and size + cost > LOG_BATCH_BUDGET:
            yield batch
            batch, size = [], 0
        batch.append(line)
        size += cost
    if batch:
        yield batch


class CommandRunner:
    """Accepts, runs and reports commands; lives as long as the agent."""

    def __init__(
        self,
        execute: Executor,
        validate: Validator,
        journal: Journal,
        settings: RunnerSettings | None = None,
    ) -> None:
        self._execute = execute
        self._validate = validate
        self.journal = journal
        self.settings = settings or RunnerSettings()
        self.jobs: dict[tuple[str, int], Job] = {}
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._session: Session | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Attempts started since the agent started, and finished by (type, outcome).
        self.started = 0
        self.finished: Counter[tuple[str, str]] = Counter()

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Run the workers and the journal until cancelled."""
        await self.journal.load()
        for (command_id, attempt), result in self.journal.results.items():
            # Results produced before a restart, still owed to the server.
            job = Job(command_id, attempt, "", "", {}, 0.0, state="finished", result=result)
            self.jobs[job.key] = job
        workers = [
            asyncio.create_task(self._work(), name=f"command worker {n}")
            for n in range(self.settings.concurrency)
        ]
        journal = asyncio.create_task(self.journal.run(), name="command journal")
        try:
            await asyncio.gather(*workers, journal)
        finally:
            for task in (*workers, journal, *self._tasks):
                task.cancel()
            await asyncio.gather(*workers, journal, *self._tasks, return_exceptions=True)

    def connected(self, session: Session) -> None:
        """A session is up: every job the server has not acknowledged reports."""
        self._session = session
        for job in list(self.jobs.values()):
            self._report(job)

    def disconnected(self) -> None:
        self._session = None

    # ---------------------------------------------------------------- offers

    async def handle_offer(self, stream: MuxStream) -> None:
        """Serve one ``command`` stream: validate, deduplicate, queue."""
        answer = self._accept(stream.headers, await _read_spec(stream))
        await stream.write(encode_record(answer))
        stream.end()

    def _accept(self, headers: dict[str, Any], offer: dict[str, Any] | str) -> dict[str, Any]:
        command_id, attempt = headers.get("id"), headers.get("attempt")
        if not isinstance(command_id, str) or type(attempt) is not int or attempt < 1:
            return {"accepted": False, "reason": "the offer needs an id and an attempt"}
        if isinstance(offer, str):
            return {"accepted": False, "reason": offer}
        if self.journal.accepted(command_id, attempt) or (command_id, attempt) in self.jobs:
            return {"accepted": False, "reason": "duplicate"}
        spec = offer.get("spec")
        timeout = offer.get("timeout_seconds")
        if not isinstance(spec, dict) or not isinstance(timeout, int | float) or timeout <= 0:
            return {"accepted": False, "reason": "the offer needs a spec and a timeout"}
        try:
            self._validate(spec)
            # Only ever from the server's offer: the spec has no say in it.
            identity = identity_from_offer(offer.get("identity"))
        except ValueError as exc:
            return {"accepted": False, "reason": str(exc)[:500]}
        queued = sum(1 for job in self.jobs.values() if job.state == "queued")
        if queued >= self.settings.queue_limit:
            return {"accepted": False, "reason": "busy"}
        job = Job(
            command_id,
            attempt,
            str(headers.get("type", "")),
            str(headers.get("name", "")),
            spec,
            float(timeout),
            identity,
        )
        self.jobs[job.key] = job
        self.journal.accept(command_id, attempt)
        self._queue.put_nowait(job)
        self._report(job)
        return {"accepted": True}

    def on_message(self, kind: str, body: dict[str, Any]) -> None:
        if kind != kinds.MESSAGE_COMMAND_CANCEL:
            return
        job = self.jobs.get((str(body.get("id")), body.get("attempt")))  # type: ignore[arg-type]
        if job is None or job.state == "finished":
            return
        job.cancel_requested = True
        if job.state == "queued":
            self._finish(job, "cancelled", {}, "cancelled before it started")
        elif job.task is not None:
            job.task.cancel()

    # --------------------------------------------------------------- running

    async def _work(self) -> None:
        while True:
            job = await self._queue.get()
            if job.state != "queued":
                continue  # cancelled while queued
            job.task = asyncio.create_task(self._run_job(job), name=f"command {job.id}")
            self._tasks.add(job.task)
            job.task.add_done_callback(self._tasks.discard)
            # Not ``await job.task``: cancelling this worker must not look
            # like cancelling the command; run() cancels both at shutdown.
            await asyncio.wait({job.task})

    async def _run_job(self, job: Job) -> None:
        job.state = "running"
        self.started += 1
        job.changed.set()
        workdir = Path(
            tempfile.mkdtemp(prefix=f"command-{job.id[:8]}-", dir=self.settings.workroot)
        )
        context = JobContext(
            job.id, job.attempt, workdir, lambda line: self._log(job, line), job.identity
        )
        try:
            result = await asyncio.wait_for(self._execute(job.spec, context), job.timeout)
        except TimeoutError:
            self._finish(
                job, "timed_out", {}, f"the command ran over its timeout of {job.timeout:g}s"
            )
        except asyncio.CancelledError:
            if not job.cancel_requested:
                raise
            self._finish(
                job, "cancelled", {}, "cancelled while running; its processes were stopped"
            )
        except Exception as exc:
            logger.exception("command failed inside the agent", extra={"command": job.id})
            self._finish(job, "failed", {}, f"the agent failed running it: {exc!r}"[:1000])
        else:
            self._finish(
                job,
                str(result.get("outcome", "failed")),
                result.get("summary") or {},
                result.get("error"),
                list(result.get("outputs") or []),
            )
        finally:
            await asyncio.to_thread(shutil.rmtree, workdir, True)

    def _finish(
        self,
        job: Job,
        outcome: str,
        summary: dict[str, Any],
        error: str | None,
        outputs: list[str] | None = None,
    ) -> None:
        job.state = "finished"
        self.finished[(job.type or "unknown", outcome)] += 1
        job.result = {
            "outcome": outcome,
            "summary": summary,
            "outputs": outputs or [],
            "error": error,
        }
        self.journal.finish(job.id, job.attempt, job.result)
        job.changed.set()
        logger.info("command %s %s", job.id, outcome, extra={"command": job.id})

    def _log(self, job: Job, line: str) -> None:
        job.logs.append(line[: self.settings.max_line])
        if len(job.logs) > self.settings.max_pending_log_lines:
            job.logs.popleft()
            job.dropped_lines += 1
        job.changed.set()

    # ------------------------------------------------------------- reporting

    def _report(self, job: Job) -> None:
        """Keep one report stream for the job while connected."""
        if job.reporting or self._session is None:
            return
        job.reporting = True
        task = asyncio.create_task(self._report_job(job, self._session), name=f"report {job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _report_job(self, job: Job, session: Session) -> None:
        try:
            stream = session.open_stream(
                kinds.STREAM_COMMAND_REPORT, {"id": job.id, "attempt": job.attempt}
            )
        except (SessionError, LocalProtocolError) as exc:
            # Reported again on the next connection (or when a slot frees).
            logger.warning(
                "cannot open the report of %s: %s", job.id, exc, extra={"command": job.id}
            )
            job.reporting = False
            self._resume_elsewhere(job, session)
            return
        replies = asyncio.create_task(_read_reply(stream))
        try:
            await self._pump(job, stream, replies)
        except (SessionError, MalformedFrameError) as exc:
            logger.debug("report of %s interrupted: %s", job.id, exc)
        finally:
            job.reporting = False
            replies.cancel()
            with contextlib.suppress(asyncio.CancelledError, SessionError, MalformedFrameError):
                await replies
            if stream.error is None:
                if replies.done() and not replies.cancelled() and replies.exception() is None:
                    # The server answered and ends its half: end ours too, or the
                    # stream stays open on both sides, holding one of the peer's
                    # max_streams slots (and a place in Session._ending) for good.
                    stream.end()
                else:
                    stream.reset(ErrorCode.CANCEL)
            self._resume_elsewhere(job, session)

    def _resume_elsewhere(self, job: Job, ended: Session) -> None:
        """Report again on a newer session if this one ended with the job unacknowledged.

        A reconnect calls :meth:`connected` while this report may still be winding
        down on the old session; then it skipped the job (already reporting), so
        the job's report must restart here or the server never hears of it.
        """
        current = self._session
        if current is None or job.key not in self.jobs:
            return
        if current is not ended:
            self._report(job)
        elif current.is_open:
            # The server failed the report (its database was away, say) on a session
            # that goes on: report again a little later, or the result waits for the
            # next reconnect.
            task = asyncio.create_task(self._report_later(job), name=f"report again {job.id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _report_later(self, job: Job) -> None:
        await asyncio.sleep(random.uniform(REPORT_RETRY / 2, REPORT_RETRY))  # noqa: S311 - jitter
        if job.key in self.jobs:
            self._report(job)

    async def _pump(
        self, job: Job, stream: MuxStream, replies: asyncio.Task[dict[str, Any]]
    ) -> None:
        announced = False
        while True:
            if not announced and job.state != "queued":
                await stream.write(encode_record({"event": "started"}))
                announced = True
            if job.logs or job.dropped_lines:
                lines = list(job.logs)
                if job.dropped_lines:
                    lines.insert(0, f"[{job.dropped_lines} log lines dropped while disconnected]")
                job.logs.clear()
                job.dropped_lines = 0
                for batch in log_batches(lines):
                    await stream.write(encode_record({"event": "log", "lines": batch}))
            if job.state == "finished":
                assert job.result is not None
                await stream.write(encode_record({"event": "result", **job.result}))
                reply = await replies
                self._acknowledged(job, reply)
                return
            if replies.done():
                self._acknowledged(job, replies.result())
                return
            job.changed.clear()
            changed = asyncio.create_task(job.changed.wait())
            done, _ = await asyncio.wait(
                {changed, replies},
                timeout=self.settings.heartbeat,
                return_when=asyncio.FIRST_COMPLETED,
            )
            changed.cancel()
            if not done:
                await stream.write(encode_record({"event": "heartbeat"}))

    def _acknowledged(self, job: Job, reply: dict[str, Any]) -> None:
        if "stale" in reply:
            # The server moved on (the lease lapsed, another attempt runs):
            # this attempt must stop and its result means nothing.
            logger.warning(
                "attempt %d of %s is stale: %s",
                job.attempt,
                job.id,
                reply["stale"],
                extra={"command": job.id},
            )
            if job.task is not None and not job.task.done():
                job.cancel_requested = True
                job.task.cancel()
            elif job.state == "queued":
                # Still waiting in the queue: the worker skips what is not queued.
                job.cancel_requested = True
                job.state = "finished"
        self.jobs.pop(job.key, None)
        self.journal.acknowledged(job.id, job.attempt)


async def _read_spec(stream: MuxStream) -> dict[str, Any] | str:
    reader = RecordReader(limit=_MAX_SPEC)
    try:
        while chunk := await stream.read():
            for record in reader.feed(chunk):
                return record
    except MalformedFrameError as exc:
        return f"the offer is malformed: {exc}"
    return "the offer carried no spec"


async def _read_reply(stream: MuxStream) -> dict[str, Any]:
    reader = RecordReader(limit=64 * 1024)
    while chunk := await stream.read():
        for record in reader.feed(chunk):
            return record
    raise SessionError("the server ended the report without an answer")
