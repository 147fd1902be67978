"""The command queue in the store: states, attempts, leases, logs and pruning (each engine)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from tunnel_server.store import (
    AlreadyExistsError,
    InvalidValueError,
    NotFoundError,
    QueueFullError,
    Store,
)
from tunnel_server.store.commands import CommandRecord, NewCommand

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LEASE = NOW + timedelta(seconds=30)
DAY = timedelta(days=1)


def new(
    command_id: str,
    *,
    cluster: str = "prod",
    submitter: str = "ann",
    attempts: int = 2,
    key: str | None = None,
    spec: dict[str, object] | None = None,
) -> NewCommand:
    return NewCommand(
        command_id,
        cluster,
        submitter,
        "query",
        "list pods",
        {"n": 1, "list": [1, "a"]} if spec is None else spec,
        attempts,
        60.0,
        key,
    )


async def running(store: Store, command_id: str, attempts: int = 2) -> CommandRecord:
    await store.add_command(new(command_id, attempts=attempts), NOW)
    assert await store.mark_delivered(command_id, 1, NOW, LEASE) is not None
    record = await store.mark_running(command_id, 1, NOW, LEASE)
    assert record is not None
    return record


async def test_a_new_command_is_pending_and_reads_back_whole(store: Store) -> None:
    record, created = await store.add_command(new("c1"), NOW)
    assert created
    assert (record.state, record.attempt, record.max_attempts) == ("pending", 0, 2)
    assert record.spec == {"n": 1, "list": [1, "a"]}
    assert (record.created_at, record.updated_at) == (NOW, NOW)
    assert record.timeout_seconds == 60.0
    assert not record.finished
    assert await store.get_command("c1") == record


async def test_an_unknown_command_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no command 'nope'"):
        await store.get_command("nope")
    with pytest.raises(NotFoundError):
        await store.request_cancel("nope", NOW)
    with pytest.raises(NotFoundError):
        await store.append_command_log("nope", 1, ["x"], NOW, cap=100)


async def test_a_command_id_is_taken_once(store: Store) -> None:
    await store.add_command(new("c1"), NOW)
    with pytest.raises(AlreadyExistsError):
        await store.add_command(new("c1"), NOW)


@pytest.mark.parametrize("attempts", [0, 101])
async def test_attempts_out_of_range_are_refused(store: Store, attempts: int) -> None:
    with pytest.raises(InvalidValueError, match="max_attempts"):
        await store.add_command(new("c1", attempts=attempts), NOW)


async def test_an_idempotency_key_answers_a_retry_with_the_first_command(store: Store) -> None:
    first, created = await store.add_command(new("c1", key="k"), NOW)
    again, created_again = await store.add_command(new("c2", key="k"), NOW + DAY)
    assert (created, created_again) == (True, False)
    assert again == first
    with pytest.raises(NotFoundError):
        await store.get_command("c2")


async def test_an_idempotency_key_used_for_another_command_is_refused(store: Store) -> None:
    await store.add_command(new("c1", key="k"), NOW)
    with pytest.raises(AlreadyExistsError, match="idempotency key 'k'"):
        await store.add_command(new("c2", key="k", spec={"other": True}), NOW)


async def test_each_submitter_and_cluster_has_keys_of_their_own(store: Store) -> None:
    await store.add_command(new("c1", key="k"), NOW)
    _, by_bob = await store.add_command(new("c2", key="k", submitter="bob"), NOW)
    _, on_dev = await store.add_command(new("c3", key="k", cluster="dev"), NOW)
    assert by_bob
    assert on_dev


async def test_concurrent_submissions_with_one_key_store_one_command(
    store: Store,
) -> None:
    results = await asyncio.gather(
        *(store.add_command(new(f"c{i}", key="k"), NOW) for i in range(10))
    )
    assert sum(created for _, created in results) == 1
    assert len({record.id for record, _ in results}) == 1
    assert len(await store.list_commands()) == 1


async def test_a_full_queue_refuses_new_commands_but_answers_retries(store: Store) -> None:
    await store.add_command(new("c1", key="k"), NOW, max_pending=2)
    await store.add_command(new("c2"), NOW, max_pending=2)
    with pytest.raises(QueueFullError, match="already has 2 commands waiting"):
        await store.add_command(new("c3"), NOW, max_pending=2)
    _, created = await store.add_command(new("c4", key="k"), NOW, max_pending=2)
    assert not created
    await store.add_command(new("d1", cluster="dev"), NOW, max_pending=2)  # its own queue


async def test_concurrent_submissions_never_overfill_a_queue(store: Store) -> None:
    results = await asyncio.gather(
        *(store.add_command(new(f"c{i}"), NOW, max_pending=3) for i in range(12)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, tuple) for r in results) == 3
    assert all(isinstance(r, tuple | QueueFullError) for r in results)
    assert len(await store.pending_commands("prod")) == 3


async def test_pending_commands_are_oldest_first_and_of_their_cluster(store: Store) -> None:
    await store.add_command(new("b"), NOW + timedelta(seconds=1))
    await store.add_command(new("a"), NOW + timedelta(seconds=2))
    await store.add_command(new("c"), NOW)
    await store.add_command(new("d", cluster="dev"), NOW)
    assert [c.id for c in await store.pending_commands("prod")] == ["c", "b", "a"]
    assert [c.id for c in await store.pending_commands("prod", limit=2)] == ["c", "b"]


async def test_list_commands_is_newest_first_filtered_and_without_specs(store: Store) -> None:
    await store.add_command(new("old"), NOW)
    await store.add_command(new("new", submitter="bob"), NOW + DAY)
    await store.add_command(new("dev", cluster="dev"), NOW + timedelta(seconds=1))
    listed = await store.list_commands()
    assert [c.id for c in listed] == ["new", "dev", "old"]
    assert all(c.spec == {} for c in listed)
    assert [c.id for c in await store.list_commands(cluster="prod")] == ["new", "old"]
    assert [c.id for c in await store.list_commands(submitter="bob")] == ["new"]
    assert [c.id for c in await store.list_commands(state="running")] == []
    assert [c.id for c in await store.list_commands(limit=1)] == ["new"]


async def test_delivery_running_and_finishing_follow_the_attempt(store: Store) -> None:
    await store.add_command(new("c1"), NOW)
    assert await store.mark_delivered("c1", 2, NOW, LEASE) is None  # not the next attempt
    delivered = await store.mark_delivered("c1", 1, NOW, LEASE)
    assert delivered is not None
    assert (delivered.state, delivered.attempt, delivered.lease_expires_at) == (
        "delivered",
        1,
        LEASE,
    )
    assert await store.mark_delivered("c1", 1, NOW, LEASE) is None  # no longer pending
    assert await store.mark_running("c1", 2, NOW, LEASE) is None  # stale
    later = NOW + timedelta(seconds=5)
    started = await store.mark_running("c1", 1, later, LEASE)
    assert started is not None
    assert (started.state, started.started_at) == ("running", later)
    again = await store.mark_running("c1", 1, NOW + DAY, LEASE)  # after a reconnect
    assert again is not None
    assert again.started_at == later
    assert await store.extend_lease("c1", 1, LEASE + DAY)
    assert not await store.extend_lease("c1", 2, LEASE + DAY)
    assert (await store.get_command("c1")).lease_expires_at == LEASE + DAY

    done = await store.finish_command("c1", 1, "succeeded", {"rows": [1, 2]}, None, later)
    assert done is not None
    assert (done.state, done.result, done.finished_at) == ("succeeded", {"rows": [1, 2]}, later)
    assert done.lease_expires_at is None
    assert done.finished
    assert await store.finish_command("c1", 1, "failed", None, "late", later) is None
    assert not await store.extend_lease("c1", 1, LEASE)


async def test_only_a_final_state_finishes_a_command(store: Store) -> None:
    await running(store, "c1")
    with pytest.raises(InvalidValueError, match="not a final state"):
        await store.finish_command("c1", 1, "running", None, None, NOW)


async def test_many_replicas_competing_deliver_each_command_once(
    store: Store,
) -> None:
    """Offers race on every pending command: each attempt is delivered exactly once."""
    for i in range(20):
        await store.add_command(new(f"c{i:02}"), NOW)

    async def offer_all() -> list[str]:
        won = []
        for record in await store.pending_commands("prod"):
            if await store.mark_delivered(record.id, record.attempt + 1, NOW, LEASE):
                won.append(record.id)
        return won

    rounds = await asyncio.gather(*(offer_all() for _ in range(8)))
    delivered = [command_id for won in rounds for command_id in won]
    assert sorted(delivered) == [f"c{i:02}" for i in range(20)]


async def test_withdrawing_cancels_only_a_pending_command(store: Store) -> None:
    await store.add_command(new("c1"), NOW)
    withdrawn = await store.withdraw_pending("c1", "the cluster was deleted", NOW)
    assert withdrawn is not None
    assert (withdrawn.state, withdrawn.error) == ("cancelled", "the cluster was deleted")
    assert await store.withdraw_pending("c1", "again", NOW) is None
    await running(store, "c2")
    assert await store.withdraw_pending("c2", "no", NOW) is None


async def test_cancelling_ends_a_pending_command_and_flags_a_running_one(store: Store) -> None:
    await store.add_command(new("c1"), NOW)
    cancelled = await store.request_cancel("c1", NOW)
    assert (cancelled.state, cancelled.cancel_requested) == ("cancelled", True)
    assert cancelled.error == "cancelled before delivery"
    await running(store, "c2")
    flagged = await store.request_cancel("c2", NOW + DAY)
    assert (flagged.state, flagged.cancel_requested, flagged.updated_at) == (
        "running",
        True,
        NOW + DAY,
    )
    finished = await store.request_cancel("c1", NOW + DAY)
    assert finished == cancelled


async def test_lapsed_leases_are_requeued_lost_or_cancelled(store: Store) -> None:
    await running(store, "again", attempts=2)
    await running(store, "last", attempts=1)
    await running(store, "cancel", attempts=2)
    await store.request_cancel("cancel", NOW)
    after = LEASE + timedelta(seconds=1)
    assert await store.lapsed_lease_clusters(after) == ["prod"]
    assert await store.lapsed_lease_clusters(LEASE) == []

    lapsed = await store.lapse_leases(after, {}, absent_before=after)
    judged = {item.command.id: (item.command.state, item.requeued) for item in lapsed}
    assert judged == {
        "again": ("pending", True),
        "last": ("lost", False),
        "cancel": ("cancelled", False),
    }
    lost = await store.get_command("last")
    assert lost.error == "the agent was lost during attempt 1 of 1"
    assert lost.lease_expires_at is None
    assert await store.lapse_leases(after, {}, absent_before=after) == []
    assert await store.mark_delivered("again", 2, after, after + DAY) is not None


async def test_leases_are_judged_by_their_clusters_agent(store: Store) -> None:
    await running(store, "c1")
    heard = {"prod": LEASE}  # heard from when the lease ran out: not after
    assert await store.lapse_leases(LEASE + DAY, heard, absent_before=None) == []
    heard = {"dev": LEASE + DAY}
    assert await store.lapse_leases(LEASE + DAY, heard, absent_before=None) == []
    heard = {"prod": LEASE + timedelta(seconds=1)}
    [lapsed] = await store.lapse_leases(LEASE + DAY, heard, absent_before=None)
    assert lapsed.command.id == "c1"


async def test_concurrent_reapers_judge_each_lease_once(store: Store) -> None:
    for i in range(10):
        await running(store, f"c{i}", attempts=3)
    after = LEASE + timedelta(seconds=1)
    rounds = await asyncio.gather(
        *(store.lapse_leases(after, {}, absent_before=after) for _ in range(4))
    )
    judged = sorted(item.command.id for lapsed in rounds for item in lapsed)
    assert judged == sorted(f"c{i}" for i in range(10))


async def test_a_log_keeps_lines_in_order_up_to_its_cap(store: Store) -> None:
    await running(store, "c1")
    assert await store.append_command_log("c1", 1, ["one", "", "three"], NOW, cap=100) == 3
    assert await store.append_command_log("c1", 1, ["x" * 90, "more"], NOW, cap=100) == 0
    assert await store.append_command_log("c1", 1, ["after"], NOW, cap=100) == 0
    lines = await store.command_log("c1")
    assert [line.text for line in lines] == ["one", "", "three", lines[-1].text]
    assert "log truncated" in lines[-1].text
    assert all(line.attempt == 1 and line.time == NOW for line in lines)
    record = await store.get_command("c1")
    assert (record.log_bytes, record.log_truncated) == (4 + 1 + 6, True)
    assert [line.text for line in await store.command_log("c1", after=lines[0].seq)][:2] == [
        "",
        "three",
    ]
    assert len(await store.command_log("c1", limit=2)) == 2


async def test_concurrent_appends_keep_every_line_and_a_true_count(store: Store) -> None:
    await running(store, "c1")
    await asyncio.gather(
        *(
            store.append_command_log("c1", 1, [f"{i}-a", f"{i}-b"], NOW, cap=1 << 20)
            for i in range(8)
        )
    )
    lines = [line.text for line in await store.command_log("c1")]
    assert len(lines) == 16
    for i in range(8):  # each append's lines stay together, in order
        assert lines.index(f"{i}-b") == lines.index(f"{i}-a") + 1
    assert (await store.get_command("c1")).log_bytes == sum(len(text) + 1 for text in lines)


async def test_count_commands_counts_recent_and_active_ones_by_state(store: Store) -> None:
    await store.add_command(new("p"), NOW - DAY)
    await running(store, "r")
    await running(store, "done")
    await store.finish_command("done", 1, "failed", None, "boom", NOW - DAY)
    await running(store, "recent")
    await store.finish_command("recent", 1, "succeeded", None, None, NOW)
    assert await store.count_commands(NOW - timedelta(hours=1)) == {
        "pending": 1,
        "running": 1,
        "succeeded": 1,
    }


async def test_pruning_deletes_finished_commands_and_logs_in_batches(store: Store) -> None:
    for i in range(3):
        await running(store, f"old{i}")
        await store.append_command_log(f"old{i}", 1, ["a", "b"], NOW, cap=100)
        await store.finish_command(f"old{i}", 1, "succeeded", None, None, NOW + timedelta(i))
    await running(store, "active")
    await store.append_command_log("active", 1, ["kept"], NOW, cap=100)
    cutoff = NOW + 10 * DAY
    assert await store.delete_finished_command_logs(cutoff, limit=4) == 4
    assert await store.delete_finished_command_logs(cutoff, limit=4) == 2
    assert await store.delete_finished_command_logs(cutoff, limit=4) == 0
    assert await store.delete_finished_commands(cutoff, limit=2) == 2
    assert {c.id for c in await store.list_commands()} == {"old2", "active"}  # oldest went
    assert await store.delete_finished_commands(cutoff, limit=2) == 1
    assert await store.delete_finished_commands(cutoff, limit=2) == 0
    assert [line.text for line in await store.command_log("active")] == ["kept"]
