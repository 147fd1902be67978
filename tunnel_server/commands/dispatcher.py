"""Delivering commands to agents: offers, leases, reports, cancellation.

Each cluster has one dispatch loop. It wakes when a command is submitted,
when the cluster's agent connects, and when a command finishes (a slot
frees). It offers pending commands in order, each on a ``command`` stream; an
accepted offer becomes a delivery under a lease. The agent reports on its own
``command.report`` streams: start, log lines, heartbeats, and the result,
which the server acknowledges only once it is stored. A lease that lapses
(the agent is gone) requeues the command while attempts remain, else marks
it lost; a report from any other attempt is refused as stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

from protocol import kinds
from protocol.errors import LocalProtocolError, MalformedFrameError
from protocol.records import RecordReader, encode_record
from tunnel_mux import MuxStream, SessionError
from tunnel_server.access.cache import AccessCache
from tunnel_server.agents.registry import AgentConnection, AgentRegistry
from tunnel_server.audit import AuditWriter
from tunnel_server.clock import utcnow
from tunnel_server.commands.specs import command_identity
from tunnel_server.config import CommandSettings
from tunnel_server.metrics import ServerMetrics
from tunnel_server.store.base import AuditEvent, NotFoundError, Store, StoreError
from tunnel_server.store.commands import CommandRecord, LapsedLease, NewCommand

__all__ = ["CommandDispatcher"]

logger = logging.getLogger(__name__)

_OUTCOMES = frozenset({"succeeded", "failed", "cancelled", "timed_out"})
_MAX_LOG_LINES = 1000
_MAX_LINE = 16 * 1024
#: Bytes of unfinished report records one cluster's agent may have the server
#: hold, all its report streams together (a record alone may be up to
#: MAX_RECORD; the bytes are read, and so acknowledged, as they come).
MAX_REPORT_BUFFER = 16 * 1024 * 1024
#: Offers a dispatch loop keeps in flight to one agent.
OFFER_WINDOW = 32
#: Pending commands a dispatch loop reads from the store at a time.
PENDING_BATCH = 128


class CommandDispatcher:
    """Owns the dispatch loops, the lease reaper and the followers' wake-ups."""

    def __init__(
        self,
        store: Store,
        registry: AgentRegistry,
        audit: AuditWriter,
        settings: CommandSettings | None = None,
        metrics: ServerMetrics | None = None,
        *,
        access: AccessCache,
    ) -> None:
        self.metrics = metrics or ServerMetrics()
        self.store = store
        #: Whether a submitter may still send a command, asked again before each offer.
        self.access = access
        self.registry = registry
        self.audit = audit
        self.settings = settings or CommandSettings()
        self._kicks: dict[str, asyncio.Event] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}
        #: One event per command someone waits on, alive while a waiter holds it.
        self._changes: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )
        self._reaper: asyncio.Task[None] | None = None
        #: Bytes of unfinished report records held, by cluster.
        self.report_buffered: Counter[str] = Counter()
        #: Command logs followed now, by user (the API bounds them).
        self.follows: Counter[str] = Counter()
        #: Offers in progress, by command: set once the acceptance is recorded.
        self._offering: dict[str, asyncio.Event] = {}
        #: Whether another replica holds a cluster's agent (None: this server is alone).
        self.held_elsewhere: Callable[[str], Awaitable[bool]] | None = None

    # ------------------------------------------------------------- lifecycle

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Dispatch and reap leases while the block runs."""
        self._reaper = asyncio.create_task(self._reap_forever(), name="lease reaper")
        try:
            yield
        finally:
            tasks = [self._reaper, *self._loops.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ operations

    async def submit(
        self,
        cluster: str,
        submitter: str,
        spec: dict[str, Any],
        facts: tuple[str, str, float, int],
        idempotency_key: str | None,
    ) -> tuple[CommandRecord, bool]:
        """Store a command durably, then push it if the agent is connected."""
        kind, name, timeout, max_attempts = facts
        record, created = await self.store.add_command(
            NewCommand(
                id=str(uuid.uuid4()),
                cluster=cluster,
                submitter=submitter,
                type=kind,
                name=name,
                spec=spec,
                max_attempts=max_attempts,
                timeout_seconds=timeout,
                idempotency_key=idempotency_key,
            ),
            utcnow(),
            self.settings.max_pending,
        )
        if created:
            self.metrics.commands_submitted.labels(record.type).inc()
            await self._audit(record, "submit", submitter)
            self.kick(cluster)
        return record, created

    async def cancel(self, command_id: str, user: str) -> CommandRecord:
        """Cancel a command: at once if pending, else by telling its agent."""
        record = await self.store.request_cancel(command_id, utcnow())
        await self._audit(record, "cancel", user)
        if record.finished:
            self._finished(record)
        self._changed(record.id)
        if record.state in ("delivered", "running"):
            self._send_cancel(record)
        return record

    def kick(self, cluster: str) -> None:
        """Wake the cluster's dispatch loop (starting it if needed)."""
        event = self._kicks.get(cluster)
        if event is None:
            event = self._kicks[cluster] = asyncio.Event()
            self._loops[cluster] = asyncio.create_task(
                self._dispatch_forever(cluster, event), name=f"dispatch {cluster}"
            )
        event.set()

    async def heard_change(
        self, cluster: str, command_id: str, state: str | None, cancel: bool
    ) -> None:
        """Another replica changed a command (submitted, requeued, cancelled, logged):
        wake its followers here, and act if this replica holds its cluster's agent."""
        self._changed(command_id)
        if self.registry.get(cluster) is None:
            return
        if state == "pending":
            self.kick(cluster)
        elif cancel and state in ("delivered", "running"):
            self._send_cancel(await self.store.get_command(command_id))

    def change_of(self, command_id: str) -> asyncio.Event:
        """An event set at the command's next change (state or log).

        Taken before reading the command, so that a change between the read
        and the wait is not missed.
        """
        event = self._changes.get(command_id)
        if event is None:
            event = self._changes[command_id] = asyncio.Event()
        return event

    async def wait_change(self, command_id: str, patience: float) -> None:
        """Wait until the command changes (state or log), or ``patience`` seconds pass."""
        await wait_for_change(self.change_of(command_id), patience)

    # -------------------------------------------------------------- dispatch

    async def _dispatch_forever(self, cluster: str, kick: asyncio.Event) -> None:
        while True:
            await kick.wait()
            kick.clear()
            try:
                await self._dispatch_pending(cluster)
            except Exception:
                # A store or logic failure must not end the loop for good;
                # the next kick (submission, reconnect, result) retries.
                logger.exception("dispatch failed", extra={"cluster": cluster})

    async def _dispatch_pending(self, cluster: str) -> None:
        while True:
            agent = self.registry.get(cluster)
            if agent is None:
                return
            pending = await self.store.pending_commands(cluster, limit=PENDING_BATCH)
            if not pending or not await self._offer_all(agent, pending):
                return  # nothing pending, or busy or gone: a later kick resumes

    async def _offer_all(self, agent: AgentConnection, records: list[CommandRecord]) -> bool:
        """Offer ``records`` in order, OFFER_WINDOW at a time; False once one is not taken.

        The window slides: an offer starts as soon as an earlier one ends, so
        the agent's round trips overlap instead of being paid one window at a
        time. A refusal or a failure (the store) stops new offers, but those
        in flight run to their end: one reset after the agent accepted it
        would leave the agent running an attempt the server still holds
        pending. The first failure is raised once they have.
        """
        slots = asyncio.Semaphore(OFFER_WINDOW)
        stop = False
        failures: list[Exception] = []

        async def offer(record: CommandRecord) -> None:
            nonlocal stop
            try:
                if not await self._offer(agent, record):
                    stop = True
            except Exception as exc:  # noqa: BLE001 - kept, raised once the others end
                stop = True
                failures.append(exc)
            finally:
                slots.release()

        async with asyncio.TaskGroup() as offers:
            for record in records:
                await slots.acquire()
                if stop:
                    slots.release()
                    break
                offers.create_task(offer(record), name=f"offer {record.id}")
        if failures:
            raise failures[0]
        return not stop

    async def _offer(self, agent: AgentConnection, record: CommandRecord) -> bool:
        """Offer one command; False when the agent cannot take more now."""
        identity = await self._still_allowed(record)
        if identity is None:
            return True
        offered = self._offering[record.id] = asyncio.Event()
        try:
            return await self._offer_attempt(agent, record, identity)
        finally:
            offered.set()
            del self._offering[record.id]

    async def _offer_attempt(
        self, agent: AgentConnection, record: CommandRecord, identity: dict[str, Any]
    ) -> bool:
        attempt = record.attempt + 1
        headers = {"id": record.id, "attempt": attempt, "type": record.type, "name": record.name}
        try:
            stream = agent.session.open_stream(kinds.STREAM_COMMAND, headers)
        except (LocalProtocolError, SessionError):
            return False
        try:
            await stream.write(
                # The identity rides with the offer, decided now by the submitter's
                # grant; the agent takes it from nowhere else (docs/security.md, "Commands").
                encode_record(
                    {
                        "spec": record.spec,
                        "timeout_seconds": record.timeout_seconds,
                        "identity": identity,
                    }
                )
            )
            stream.end()
            answer = await asyncio.wait_for(_first_record(stream), self.settings.offer_timeout)
        except (SessionError, MalformedFrameError, TimeoutError) as exc:
            logger.warning(
                "offer of %s failed: %s", record.id, exc, extra={"cluster": agent.cluster}
            )
            stream.reset()
            return False
        except asyncio.CancelledError:
            stream.reset()  # the command stays pending; an accepted attempt comes back as duplicate
            raise
        now = utcnow()
        lease = now + timedelta(seconds=self.settings.lease)
        reason = str(answer.get("reason", ""))[:500]
        if answer.get("accepted") is True or reason == "duplicate":
            delivered = await self.store.mark_delivered(record.id, attempt, now, lease)
            if delivered is None and not await self._adopted(record.id, attempt):
                # Cancelled (or otherwise moved on) while the agent was
                # accepting: it holds an attempt nobody wants any more.
                _cancel_attempt(agent, record.id, attempt)
            else:
                self._changed(record.id)
                if delivered is not None and delivered.cancel_requested:
                    self._send_cancel(delivered)
            return True
        if reason == "busy":
            return False
        # The agent refused the spec itself: the command fails, with its reason.
        delivered = await self.store.mark_delivered(record.id, attempt, now, lease)
        if delivered is not None:
            finished = await self.store.finish_command(
                record.id, attempt, "failed", None, f"the agent refused the command: {reason}", now
            )
            if finished is not None:
                await self._audit(finished, "finish", finished.submitter)
        self._changed(record.id)
        return True

    async def _adopted(self, command_id: str, attempt: int) -> bool:
        """Whether the agent's report already recorded ``attempt`` as delivered (its
        acceptance of an earlier offer of the same attempt reached another replica)."""
        current = await self.store.get_command(command_id)
        return current.attempt == attempt and current.state in ("delivered", "running")

    async def _still_allowed(self, record: CommandRecord) -> dict[str, Any] | None:
        """Whom the command acts as, if the submitter may still send it; if not, it is withdrawn.

        Access is checked at submission, but a command may wait for its agent
        for days: a user deleted, or a grant taken away, meanwhile stops it.
        A command already delivered runs on (cancel it to stop it).
        """
        user = await self.access.user_named(record.submitter)
        if user is not None and await self.access.may_dispatch(user, record.cluster):
            return command_identity(user, await self.access.grant(user.name, record.cluster))
        why = (
            f"cancelled before delivery: {record.submitter} may no longer send commands"
            f" to {record.cluster} (the user was deleted or the grant withdrawn)"
        )
        withdrawn = await self.store.withdraw_pending(record.id, why, utcnow())
        if withdrawn is not None:
            logger.info(
                "withdrew a command whose submitter lost access",
                extra={"cluster": record.cluster, "command": record.id},
            )
            await self._audit(withdrawn, "finish", withdrawn.submitter)
            self._changed(record.id)
        return None

    # --------------------------------------------------------------- reports

    async def handle_report(self, cluster: str, stream: MuxStream) -> None:
        """Serve one ``command.report`` stream of ``cluster``'s agent.

        When the store cannot record what the report says, the stream is reset
        and the agent, which keeps its report until acknowledged, makes it again.
        """
        try:
            await self._handle_report(cluster, stream)
        except StoreError as exc:
            logger.warning(
                "cannot record a command report now: %s", exc, extra={"cluster": cluster}
            )
            stream.reset(reason="the server cannot record the report now; report again")

    async def _handle_report(self, cluster: str, stream: MuxStream) -> None:
        command_id = stream.headers.get("id")
        attempt = stream.headers.get("attempt")
        if not isinstance(command_id, str) or type(attempt) is not int:
            stream.reset(reason="a report needs an id and an attempt")
            return
        try:
            record = await self.store.get_command(command_id)
        except NotFoundError:
            record = None
        if record is None or record.cluster != cluster:
            # An agent reports only on its own cluster's commands.
            await _reply(stream, {"stale": "no such command on this cluster"})
            return
        reader = RecordReader()
        held = 0
        try:
            while chunk := await stream.read():
                try:
                    events = reader.feed(chunk)
                except MalformedFrameError as exc:
                    stream.reset(reason=str(exc)[:200])
                    return
                self.report_buffered[cluster] += reader.buffered - held
                held = reader.buffered
                if self.report_buffered[cluster] > MAX_REPORT_BUFFER:
                    # Else an agent's many streams, each with most of a record,
                    # would hold gigabytes of this server's memory.
                    stream.reset(reason="this cluster's reports hold too many unfinished records")
                    return
                for event in events:
                    if not await self._report_event(record, attempt, event, stream):
                        return
        finally:
            self.report_buffered[cluster] -= held
            if self.report_buffered[cluster] <= 0:
                del self.report_buffered[cluster]

    async def _report_event(
        self, record: CommandRecord, attempt: int, event: dict[str, Any], stream: MuxStream
    ) -> bool:
        """Act on one report record; False once the stream is done with."""
        kind = event.get("event")
        now = utcnow()
        lease = now + timedelta(seconds=self.settings.lease)
        if kind in ("started", "resume"):
            offered = self._offering.get(record.id)
            if offered is not None:
                # The agent may start before its acceptance is recorded: with a pool of
                # connections (PostgreSQL) the two writes would race.
                await offered.wait()
            running = await self.store.mark_running(record.id, attempt, now, lease)
            if running is None and await self.store.mark_delivered(record.id, attempt, now, lease):
                # The agent accepted this attempt, but the replica that offered it
                # stopped before recording the delivery: the agent's journal is proof.
                logger.info(
                    "adopted attempt %d of %s, accepted by the agent but never recorded",
                    attempt,
                    record.id,
                    extra={"cluster": record.cluster, "command": record.id},
                )
                running = await self.store.mark_running(record.id, attempt, now, lease)
            if running is None:
                await _reply(stream, {"stale": "this attempt is no longer current"})
                return False
            self._changed(record.id)
            if running.cancel_requested:
                self._send_cancel(running)
        elif kind == "heartbeat":
            if not await self.store.extend_lease(record.id, attempt, lease):
                await _reply(stream, {"stale": "this attempt is no longer current"})
                return False
        elif kind == "log":
            # Only the current attempt of a command still running may add to
            # its log (the lease says which): not a forged or finished one.
            if not await self.store.extend_lease(record.id, attempt, lease):
                await _reply(stream, {"stale": "this attempt is no longer current"})
                return False
            lines = [str(line)[:_MAX_LINE] for line in event.get("lines", [])][:_MAX_LOG_LINES]
            await self.store.append_command_log(
                record.id, attempt, lines, now, self.settings.log_cap
            )
            self._changed(record.id)
        elif kind == "result":
            return await self._finish(record, attempt, event, stream)
        return True

    async def _finish(
        self, record: CommandRecord, attempt: int, event: dict[str, Any], stream: MuxStream
    ) -> bool:
        outcome = event.get("outcome")
        if outcome not in _OUTCOMES:
            stream.reset(reason="a result needs an outcome")
            return False
        summary = event.get("summary")
        result = {
            "summary": summary if isinstance(summary, dict) else {},
            "outputs": [str(name)[:253] for name in event.get("outputs", [])][:256],
        }
        error = event.get("error")
        finished = await self.store.finish_command(
            record.id,
            attempt,
            outcome,
            result,
            str(error)[:4000] if error else None,
            utcnow(),
        )
        if finished is None:
            await _reply(stream, {"stale": "this attempt is no longer current"})
            return False
        await _reply(stream, {"ack": True})
        await self._audit(finished, "finish", finished.submitter)
        self._changed(record.id)
        self.kick(record.cluster)  # a slot freed on the agent
        return False

    # ----------------------------------------------------------------- leases

    async def _reap_forever(self) -> None:
        started = utcnow()
        while True:
            await asyncio.sleep(self.settings.reap_interval)
            try:
                await self.reap(utcnow(), started)
            except Exception:
                logger.exception("lease check failed")

    async def reap(self, now: datetime, started: datetime) -> list[LapsedLease]:
        """Judge the leases that ran out, as of ``now``, on a server that started at ``started``.

        Only a cluster's one agent can run its commands, so a lease is not
        judged while that agent may still come back and resume: a lease of a
        cluster whose agent is connected is judged once the agent has had a
        whole lease to report (it connected a lease ago or more) and has been
        heard from since the lease ran out; any other lease once
        :attr:`CommandSettings.agent_return_grace` has passed since it ran out
        and since this server started (a server that was down had no news of
        its agents).
        """
        clusters = await self.store.lapsed_lease_clusters(now)
        if self.held_elsewhere is not None:
            # Another replica holds the agent: that replica judges its leases.
            clusters = [name for name in clusters if not await self.held_elsewhere(name)]
        if not clusters:
            return []
        settled_since = now - timedelta(seconds=self.settings.lease)
        heard = {name: at for name in clusters if (at := self._heard(name, now, settled_since))}
        grace_ended = now - timedelta(seconds=self.settings.agent_return_grace)
        absent_before = grace_ended if started <= grace_ended else None
        if not heard and absent_before is None:
            return []
        lapsed = await self.store.lapse_leases(now, heard, absent_before)
        for item in lapsed:
            record = item.command
            logger.warning(
                "lease of command %s lapsed: %s",
                record.id,
                "requeued" if item.requeued else record.state,
                extra={"cluster": record.cluster, "command": record.id},
            )
            self._changed(record.id)
            if item.requeued:
                self.kick(record.cluster)
            else:
                await self._audit(record, "finish", record.submitter)
        return lapsed

    def _heard(self, cluster: str, now: datetime, settled_since: datetime) -> datetime | None:
        """When the cluster's agent was last heard from, if it has been connected since
        ``settled_since``. A link gone dead without a close stays registered until its
        keepalive fails: a lease that ran out since the agent was last heard from is
        not judged on it."""
        agent = self.registry.get(cluster)
        if agent is None or agent.connected_since > settled_since:
            return None
        silent = agent.session.silent_for()
        return None if silent is None else now - timedelta(seconds=silent)

    # --------------------------------------------------------------- helpers

    def _send_cancel(self, record: CommandRecord) -> None:
        agent = self.registry.get(record.cluster)
        if agent is None:
            return  # sent again when the agent resumes its report
        _cancel_attempt(agent, record.id, record.attempt)

    def _changed(self, command_id: str) -> None:
        event = self._changes.pop(command_id, None)
        if event is not None:
            event.set()

    def _finished(self, record: CommandRecord) -> None:
        self.metrics.commands_finished.labels(record.type, record.state).inc()
        if record.finished_at is not None:
            seconds = (record.finished_at - record.created_at).total_seconds()
            self.metrics.command_duration.labels(record.type).observe(max(seconds, 0.0))

    async def _audit(self, record: CommandRecord, verb: str, user: str) -> None:
        if verb == "finish":
            self._finished(record)
        await self.audit.record(
            AuditEvent(
                id=None,
                time=utcnow(),
                user=user,
                cluster=record.cluster,
                kind="command",
                verb=verb,
                path=f"{record.type}/{record.name}/{record.id}",
                status=None,
                detail={"state": record.state, "attempt": record.attempt},
            )
        )


async def _first_record(stream: MuxStream) -> dict[str, Any]:
    reader = RecordReader(limit=64 * 1024)
    while chunk := await stream.read():
        records = reader.feed(chunk)
        if records:
            return records[0]
    raise MalformedFrameError("the agent ended the offer without answering")


async def _reply(stream: MuxStream, record: dict[str, Any]) -> None:
    with contextlib.suppress(SessionError):
        await stream.write(encode_record(record))
        stream.end()


def _cancel_attempt(agent: AgentConnection, command_id: str, attempt: int) -> None:
    """Ask ``agent`` to stop ``attempt`` of the command, if its session still takes messages."""
    with contextlib.suppress(SessionError, LocalProtocolError):
        agent.session.send_message(
            kinds.MESSAGE_COMMAND_CANCEL, {"id": command_id, "attempt": attempt}
        )


async def wait_for_change(change: asyncio.Event, patience: float) -> bool:
    """Wait for ``change`` (from :meth:`CommandDispatcher.change_of`); False after ``patience``."""
    try:
        await asyncio.wait_for(change.wait(), patience)
    except TimeoutError:
        return False
    return True
