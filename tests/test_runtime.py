"""The runtime: runs with mailboxes, cancel, approvals, restarts, the bus and admission control."""

from __future__ import annotations

import asyncio
import os
import time
import types
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from helpers import alive, nap, until, within
from tether import (
    Agent,
    HTTPSettings,
    Message,
    ModelRequest,
    ModelResponse,
    OpenAIChatModel,
    RunContext,
    ScriptedModel,
    ServerError,
    reply,
    tool,
)
from tether.approvals import approve_all, arguments_hash, deny_all
from tether.bus import EventLog
from tether.errors import ApprovalError, NoSuchRun, RunEnded, RunExists
from tether.events import Emitter, Event
from tether.run import RestartPolicy, Run
from tether.supervisor import Supervisor
from tether.tools import BUILTINS
from wire_server import WireServer


@tool(approval="always")
def pay(amount: int, to: str) -> str:
    """Send money."""
    return f"paid {amount} to {to}"


class Counting:
    """Wraps a model to count concurrent calls."""

    def __init__(self, model: Any) -> None:
        self.model, self.name, self.provider = model, model.name, model.provider
        self.in_flight = self.peak = 0

    async def respond(
        self, request: ModelRequest, on_text: Any = None, on_retry: Any = None
    ) -> ModelResponse:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            return await self.model.respond(request, on_text, on_retry)
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        pass


def events(run: Run, type_: str | None = None) -> list[Event]:
    return [e for e in run.log.events if type_ is None or e.type == type_]


def valid_transcript(messages: list[Message]) -> None:
    """Every tool call has exactly one result, right after the message that made it."""
    for i, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            results = messages[i + 1].tool_results
            assert [r.call_id for r in results] == [c.id for c in m.tool_calls]


# -- mailbox ---------------------------------------------------------------------------------


async def test_messages_sent_mid_turn_arrive_together_at_the_next_call() -> None:
    model = Counting(
        ScriptedModel(
            [reply(tool_calls=[("nap", {"seconds": 0.3})]), reply("Got both of your notes.")]
        )
    )
    sup = Supervisor()
    run = sup.start(Agent(model, [nap]), "start")
    await until(lambda: events(run, "tool_call"), "the tool call")
    run.send("first note")
    run.send("second note")
    result = await run.wait()
    assert result is not None and result.answer == "Got both of your notes."
    second = model.model.requests[1].messages
    assert [m.role for m in second] == ["user", "assistant", "tool", "user", "user"]
    assert [m.text for m in second[-2:]] == ["first note", "second note"]
    assert model.peak == 1  # never a second concurrent model call
    assert [e.data["text"] for e in events(run, "user_message")] == ["first note", "second note"]


async def test_message_that_arrives_as_the_model_answers_is_not_lost() -> None:
    asking, sent = asyncio.Event(), asyncio.Event()

    async def answering(request: ModelRequest) -> ModelResponse:
        asking.set()
        await sent.wait()  # the note arrives while the model is answering
        return reply("first answer")

    model = ScriptedModel([answering, reply("answer to the late note")])
    run = Supervisor().start(Agent(model), "hi")
    await within(asking.wait(), "the first model call")
    run.send("late note")
    sent.set()
    result = await run.wait()
    assert result is not None and result.answer == "answer to the late note"
    assert model.requests[1].messages[-1].text == "late note"


async def test_a_finished_run_refuses_messages() -> None:
    run = Supervisor().start(Agent(ScriptedModel([reply("bye")])), "hi")
    await run.wait()
    with pytest.raises(RunEnded):
        run.send("hello?")


async def test_permanent_run_stays_alive_between_answers() -> None:
    model = ScriptedModel([reply("one"), reply("two")])
    run = Supervisor().start(Agent(model), "first", restart=RestartPolicy("permanent"))
    await until(lambda: run.status == "idle", "the run to idle")
    run.send("second")
    await until(
        lambda: run.status == "idle" and len(model.requests) == 2,
        "the second answer",
    )
    assert [m.text for m in run.transcript] == ["first", "one", "second", "two"]
    run.cancel()
    await run.wait()
    assert run.status == "cancelled" and events(run)[-1].data["outcome"] == "cancelled"


# -- cancel ------------------------------------------------------------------------------------


async def test_cancel_inside_a_model_stream(wire: WireServer) -> None:
    wire.add(text="a slow answer " * 10, deltas=10, chunk_delay=0.5)
    model = OpenAIChatModel("m", api_key="k", base_url=wire.url, settings=HTTPSettings())
    run = Supervisor().start(Agent(model), "talk slowly")
    await until(lambda: events(run, "text_delta"), "the first text delta")
    assert run.cancel()
    await run.wait()
    await model.aclose()
    assert run.status == "cancelled"
    assert [m.role for m in run.transcript] == ["user"]  # the partial reply is not kept
    await until(lambda: wire.closed_streams == 1, "the stream to be closed")
    assert events(run)[-1].type == "run_finished"


async def test_cancel_inside_a_sleeping_subprocess_tool(tmp_path: Path) -> None:
    cmd = "sleep 30 & echo $! > child.pid; wait"
    model = ScriptedModel([reply(tool_calls=[("bash", {"command": cmd})])])
    run = Supervisor().start(
        Agent(model, [BUILTINS["bash"]]),
        "run it",
        context=RunContext(workspace=tmp_path),
        approver=approve_all,
    )
    pid_file = tmp_path / "child.pid"
    await until(
        lambda: pid_file.exists() and pid_file.read_text().strip(),
        "the child's pid",
    )
    run.cancel()
    await run.wait()
    pid = int(pid_file.read_text())
    await until(lambda: not alive(pid), "the tool's child process to end", timeout=5)
    assert run.status == "cancelled"
    valid_transcript(run.transcript)
    assert run.transcript[-1].tool_results[0].is_error


async def test_cancel_between_steps_while_queued() -> None:
    sup = Supervisor(max_runs=1)
    first = sup.start(
        Agent(ScriptedModel([reply(tool_calls=[("nap", {"seconds": 0.5})]), reply("ok")]), [nap]),
        "busy",
    )
    second = sup.start(Agent(ScriptedModel([reply("never")])), "waiting")
    await until(lambda: events(second, "queued"), "the second run to queue")
    assert second.status == "queued"
    sup.cancel(second.id)
    await second.wait()
    assert second.status == "cancelled" and second.transcript == []
    assert events(second)[-1].data["outcome"] == "cancelled"
    await first.wait()
    assert first.status == "done"


# -- approvals ---------------------------------------------------------------------------------


async def test_parallel_calls_each_get_their_own_approval() -> None:
    model = ScriptedModel(
        [
            reply(
                tool_calls=[
                    ("pay", {"amount": 5, "to": "ann"}),
                    ("pay", {"amount": 900, "to": "eve"}),
                ]
            ),
            reply("One payment went through."),
        ]
    )
    sup = Supervisor()
    run = sup.start(Agent(model, [pay]), "pay people")
    await until(
        lambda: len(events(run, "approval_requested")) == 2,
        "both approval requests",
    )
    requests = {e.data["arguments"]["to"]: e.data for e in events(run, "approval_requested")}
    assert requests["ann"]["approval_id"] != requests["eve"]["approval_id"]
    assert requests["ann"]["args_hash"] == arguments_hash("pay", {"amount": 5, "to": "ann"})
    with pytest.raises(ApprovalError):  # an approval bound to other arguments is refused
        run.approve(requests["eve"]["approval_id"], args_hash=requests["ann"]["args_hash"])
    ann_id, eve_id = requests["ann"]["approval_id"], requests["eve"]["approval_id"]
    run.approve(ann_id, args_hash=requests["ann"]["args_hash"])
    # decided again before the run has taken the first decision: refused, saying how
    with pytest.raises(ApprovalError, match=f"{ann_id!r} was approved already: approved by"):
        run.deny(ann_id, "too late")
    run.deny(eve_id, "that is too much")
    result = await run.wait()
    with pytest.raises(ApprovalError, match=f"{eve_id!r} was denied already: that is too much"):
        run.approve(eve_id)
    with pytest.raises(ApprovalError, match="'ap_never' is not waiting"):
        run.approve("ap_never")  # never asked: said so, not a crash of the desk
    assert result is not None and result.outcome == "done"
    outputs = {r.call_id: r for r in run.transcript[2].tool_results}
    ann, eve = (outputs[requests[k]["id"]] for k in ("ann", "eve"))
    assert (ann.output, ann.is_error) == ("paid 5 to ann", False)
    assert eve.is_error and "that is too much" in eve.output
    decided = [(e.data["approved"], e.data["reason"]) for e in events(run, "approval_decided")]
    assert sorted(decided) == [(False, "that is too much"), (True, "approved by the user")]


async def test_an_approval_expires() -> None:
    model = ScriptedModel(
        [
            reply(tool_calls=[("pay", {"amount": 1, "to": "bob"})]),
            reply("It was not approved in time."),
        ]
    )
    run = Supervisor(approval_ttl=0.2).start(Agent(model, [pay]), "pay bob")
    result = await run.wait()
    assert result is not None and result.outcome == "done"
    tool_result = run.transcript[2].tool_results[0]
    assert tool_result.is_error and "expired" in tool_result.output
    request = events(run, "approval_requested")[0].data
    assert request["expires_at"] is not None
    with pytest.raises(ApprovalError):
        run.approve(request["approval_id"])


async def test_calls_that_need_no_approval_do_not_wait() -> None:
    @tool(approval=lambda args: args["amount"] > 100)
    def transfer(amount: int) -> str:
        """Move money."""
        return f"moved {amount}"

    model = ScriptedModel([reply(tool_calls=[("transfer", {"amount": 10})]), reply("ok")])
    run = Supervisor().start(Agent(model, [transfer]), "small transfer")
    await run.wait()
    assert events(run, "approval_requested") == []
    assert run.transcript[2].tool_results[0].output == "moved 10"


# -- supervision -------------------------------------------------------------------------------


async def test_one_run_crashing_while_others_finish() -> None:
    @tool
    def explode() -> str:
        """Exit the process, if it could."""
        raise SystemExit(3)

    def crash(request: ModelRequest) -> ModelResponse:
        raise RuntimeError("bug in a model adapter")

    sup = Supervisor()
    good = [
        sup.start(
            Agent(
                ScriptedModel([reply(tool_calls=[("nap", {"seconds": 0.1})]), reply(f"ok {i}")]),
                [nap],
            ),
            f"task {i}",
        )
        for i in range(5)
    ]
    bad = sup.start(Agent(ScriptedModel([crash])), "crash")
    exiting = sup.start(
        Agent(ScriptedModel([reply(tool_calls=[("explode", {})]), reply("survived")]), [explode]),
        "exit",
    )
    await asyncio.gather(*(r.wait() for r in [*good, bad, exiting]))
    assert [r.status for r in good] == ["done"] * 5
    assert bad.status == "failed" and bad.result is not None
    assert bad.result.error is not None and "bug in a model adapter" in bad.result.error["message"]
    assert exiting.status == "done" and "SystemExit" in exiting.transcript[2].tool_results[0].output


async def test_restart_intensity_gives_up() -> None:
    errors = [ServerError("HTTP 500: down", status=500, retryable=True) for _ in range(10)]
    model = ScriptedModel(errors)
    run = Supervisor().start(Agent(model), "try", restart=RestartPolicy("transient", 2, 60))
    await run.wait()
    assert run.status == "failed" and run.attempts == 3
    assert len(events(run, "restarting")) == 2
    gave_up = events(run, "gave_up")
    assert len(gave_up) == 1 and gave_up[0].data["restarts"] == 2


async def test_transient_run_restarts_and_continues_its_transcript() -> None:
    model = ScriptedModel(
        [
            reply(tool_calls=[("nap", {"seconds": 0.01})]),
            ServerError("HTTP 503", status=503, retryable=True),
            reply("finished after a restart"),
        ]
    )
    run = Supervisor().start(Agent(model, [nap]), "go", restart=RestartPolicy("transient"))
    result = await run.wait()
    assert result is not None and result.answer == "finished after a restart"
    assert [m.role for m in run.transcript] == ["user", "assistant", "tool", "assistant"]
    assert run.attempts == 2


async def test_at_most_one_live_run_per_id() -> None:
    sup = Supervisor()
    agent = Agent(ScriptedModel([reply(tool_calls=[("nap", {"seconds": 0.2})]), reply("a")]), [nap])
    first = sup.start(agent, "one", run_id="job-1")
    with pytest.raises(RunExists):
        sup.start(agent, "two", run_id="job-1")
    assert sup.get("job-1") is first
    await first.wait()
    again = sup.start(Agent(ScriptedModel([reply("b")])), "again", run_id="job-1")
    await again.wait()
    seqs = [e.seq for e in again.log.events]
    assert seqs == list(range(len(seqs)))  # one numbered stream for the id
    with pytest.raises(NoSuchRun):
        sup.get("nope")


async def test_shutdown_cancels_what_outlives_the_deadline() -> None:
    sup = Supervisor()
    quick = sup.start(Agent(ScriptedModel([reply("quick")])), "q")
    slow = sup.start(
        Agent(ScriptedModel([reply(tool_calls=[("nap", {"seconds": 30})])]), [nap]), "s"
    )
    cancelled = await sup.shutdown(deadline=0.3)
    assert cancelled == [slow.id]
    assert quick.status == "done" and slow.status == "cancelled"
    valid_transcript(slow.transcript)
    with pytest.raises(Exception, match="shutting down"):
        sup.start(Agent(ScriptedModel([])), "late")


# -- the bus -----------------------------------------------------------------------------------


async def test_subscribers_join_from_any_offset() -> None:
    sup = Supervisor()
    run = sup.start(
        Agent(ScriptedModel([reply(tool_calls=[("nap", {"seconds": 0.1})]), reply("end")]), [nap]),
        "go",
    )
    live: list[Event] = []

    async def follow() -> None:
        async for e in sup.bus.subscribe(run.id):
            live.append(e)

    follower = asyncio.create_task(follow())
    await run.wait()
    await asyncio.wait_for(follower, 2)  # the stream ends when the run does
    assert [e.seq for e in live] == list(range(len(run.log.events)))
    late = [e async for e in sup.bus.subscribe(run.id, offset=3)]
    assert [e.seq for e in late] == list(range(3, len(run.log.events)))


async def test_a_slow_subscriber_does_not_slow_the_run_and_is_told_it_fell_behind() -> None:
    script = [reply(tool_calls=[("nap", {"seconds": 0})]) for _ in range(30)] + [reply("end")]
    sup = Supervisor()
    run = sup.start(Agent(ScriptedModel(script), [nap]), "chatty")
    subscription = sup.bus.subscribe(run.id, max_lag=10)
    first = await anext(subscription)  # joined, then reads nothing while the run goes on
    await run.wait()
    assert run.status == "done"  # finished without waiting for the reader
    rest = [e async for e in subscription]
    notices = [e for e in rest if e.type == "fell_behind"]
    assert len(notices) == 1
    seqs = [first.seq] + [e.seq for e in rest if e.type != "fell_behind"]
    assert seqs == list(range(len(run.log.events)))  # and it lost nothing


def test_watchers_added_to_a_run_see_its_events_from_then_on() -> None:
    """A run watched by no one holds no list of sinks; one that gains watchers (a resumed
    run a second caller follows) tells each of them every event after, in order, and its log
    still gets them all."""
    log = EventLog("r")
    emitter = Emitter("r", log=log)
    emitter.user_message(text="before")
    first: list[Event] = []
    second: list[Event] = []
    emitter.watch([first.append])
    emitter.user_message(text="one")
    emitter.watch([second.append])
    emitter.user_message(text="two")
    assert [e.data["text"] for e in first] == ["one", "two"]
    assert [(e.seq, e.data["text"]) for e in second] == [(2, "two")]
    assert [e.data["text"] for e in log.events] == ["before", "one", "two"]


async def test_a_log_reads_the_same_before_and_after_it_closes_and_goes_on_after() -> None:
    """A log read while it is written, followed across its close, and written again after it
    (a run's id used again) gives every event back in order, the same each time."""
    log = EventLog("r")
    emitter = Emitter("r", log=log)
    for i in range(3):
        emitter.user_message(text=f"m{i}")
    follower = log.follow()
    first = [await anext(follower) for _ in range(3)]
    assert log.at(-1).data["text"] == "m2" and len(log) == 3
    emitter.user_message(text="m3")
    log.close()
    rest = [e async for e in follower]
    assert [e.data["text"] for e in first + rest] == ["m0", "m1", "m2", "m3"]
    assert [e.to_dict() for e in log.events] == [e.to_dict() for e in first + rest]
    emitter.user_message(text="m4")  # used again after it closed
    assert [(e.seq, e.data["text"]) for e in log.events] == [(i, f"m{i}") for i in range(5)]
    assert log.at(3).data["text"] == "m3" and log.at(-1).data["text"] == "m4"


async def test_a_log_keeps_events_as_json_and_reads_back_every_event() -> None:
    """A run's events are kept as JSON bytes (no objects for the host's garbage collector to
    walk), read back the same, followed from 0, and go on if its id is used again."""
    sup = Supervisor()
    seen: list[Event] = []
    agent = Agent(ScriptedModel([reply(tool_calls=[("nap", {"seconds": 0})]), reply("end")]), [nap])
    run = sup.start(agent, "go", sinks=[seen.append])
    await run.wait()
    await asyncio.sleep(0)
    assert (
        run.log.closed
        and len(run.log.ends) == len(seen)
        and run.log.text.startswith(b'["run_started"')
    )
    assert [e.to_dict() for e in run.log.events] == [e.to_dict() for e in seen]
    followed = [e async for e in sup.bus.subscribe(run.id)]
    assert [e.to_dict() for e in followed] == [e.to_dict() for e in seen]

    again = sup.start(Agent(ScriptedModel([reply("once more")])), "again", run_id=run.id)
    await again.wait()
    seqs = [e.seq for e in again.log.events]
    assert seqs == list(range(len(seqs))) and len(seqs) > len(seen)
    assert again.log.at(-1).data["answer"] == "once more"


def test_a_log_keeps_a_value_json_has_no_type_for_as_its_str() -> None:
    """An event's data is the caller's: a path or a decimal in it is kept as its text, and the
    events on either side of it read back as they were written."""
    log = EventLog("r")
    log.add("tool_result", 0, 1.5, {"output": "ok"})
    log.add("tool_result", 1, 2.5, {"path": Path("/tmp/x"), "n": Decimal("1.10")})
    log.add("tool_result", 2, 3.5, {"output": "after"})
    assert [(e.seq, e.data) for e in log.events] == [
        (0, {"output": "ok"}),
        (1, {"path": "/tmp/x", "n": "1.10"}),
        (2, {"output": "after"}),
    ]


# -- admission ---------------------------------------------------------------------------------


async def test_runs_over_the_limit_wait_in_a_visible_queue() -> None:
    sup = Supervisor(max_runs=2)
    running = peak = 0

    @tool
    async def work() -> str:
        """Work."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.1)
        running -= 1
        return "worked"

    runs = [
        sup.start(
            Agent(ScriptedModel([reply(tool_calls=[("work", {})]), reply("ok")]), [work]),
            f"job {i}",
        )
        for i in range(5)
    ]
    await asyncio.gather(*(r.wait() for r in runs))
    assert all(r.status == "done" for r in runs)
    assert peak == 2
    queued = [r for r in runs if events(r, "queued")]
    assert len(queued) == 3 and all(events(r, "admitted") for r in queued)


async def test_model_calls_per_endpoint_are_bounded() -> None:
    sup = Supervisor(max_model_calls=2)
    shared = Counting(ScriptedModel([reply(f"answer {i}") for i in range(6)]))
    runs = [sup.start(Agent(shared), f"q{i}") for i in range(6)]
    await asyncio.gather(*(r.wait() for r in runs))
    assert all(r.status == "done" for r in runs)
    assert shared.peak == 2
    assert sum(1 for r in runs if events(r, "queued")) == 4


async def test_a_run_cancelled_in_the_model_call_queue_gives_up_its_place() -> None:
    """A model call waiting for its endpoint's slot, cancelled: it leaves the queue, no slot
    is lost or made, and the calls behind it go on."""
    sup = Supervisor(max_model_calls=1)
    gate = asyncio.Event()

    async def held(request: ModelRequest) -> ModelResponse:
        await gate.wait()
        return reply("first")

    model = Counting(ScriptedModel([held]))
    first = sup.start(Agent(model), "holds the slot")
    await until(lambda: model.in_flight == 1, "the first call to hold the slot")
    waiting = sup.start(Agent(model), "waits")
    behind = sup.start(Agent(ScriptedModel([reply("third")]), name="b"), "waits too")
    await until(lambda: events(waiting, "queued") and events(behind, "queued"), "two queued")
    assert [e.data["position"] for e in events(waiting, "queued")] == [1]
    waiting.cancel()
    assert (await waiting.wait()).outcome == "cancelled"
    assert not events(waiting, "admitted")
    gate.set()
    assert (await first.wait()).answer == "first"
    assert (await behind.wait()).answer == "third"
    assert events(behind, "admitted") and model.peak == 1
    limiter = sup.limiter_for(first.agent)
    assert limiter is not None and (limiter.active, limiter.queued) == (0, 0)


async def test_ended_runs_past_the_limit_are_forgotten() -> None:
    sup = Supervisor(keep_finished=2)
    runs = [sup.start(Agent(ScriptedModel([reply(f"answer {i}")])), f"q{i}") for i in range(5)]
    await asyncio.gather(*(r.wait() for r in runs))
    await asyncio.sleep(0)
    assert sorted(sup.runs) == sorted(r.id for r in runs[3:])
    assert sorted(sup.bus.logs) == sorted(r.id for r in runs[3:])
    with pytest.raises(NoSuchRun):
        sup.get(runs[0].id)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_runs_sharing_a_script_file_each_play_it_from_the_top(
    tmp_path: Path, store: str
) -> None:
    """The page, a worker and `tether run` build one agent per options: a second run of the
    same `--script` must get the script's first reply, not the first run's leftovers."""
    import orjson

    from tether.cli.common import cli_runtime
    from tether.options import RunOptions

    script = tmp_path / "script.json"
    script.write_bytes(
        orjson.dumps(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a", "content": "x"}}
                    ]
                },
                {"text": "Wrote a."},
            ]
        )
    )
    options = RunOptions(provider="scripted", script=str(script), workspace=str(tmp_path))
    db = None if store == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    async with cli_runtime(db) as rt:
        answers = []
        for run_id in ("first", "second", "third"):
            run = await rt.start("tether", "write a", run_id=run_id, options=options.to_dict())
            result = await run.wait()
            assert result is not None
            answers.append((result.outcome, result.answer))
    assert answers == [("done", "Wrote a.")] * 3
    assert (tmp_path / "a").read_text() == "x"  # in the options' workspace, not the cwd


async def test_the_deny_policy_denies_and_says_why() -> None:
    """`--approve deny` (no one is there to ask): the call is not made, and the model is told
    why, then goes on."""
    model = ScriptedModel(
        [reply(tool_calls=[("pay", {"amount": 5, "to": "eve"})]), reply("Not paid.")]
    )
    run = Supervisor().start(Agent(model, [pay]), "pay eve", approver=deny_all)
    result = await run.wait()
    assert result is not None and result.answer == "Not paid."
    (denied,) = run.transcript[2].tool_results
    assert denied.is_error and "denied by policy" in denied.output and "paid 5" not in denied.output


def test_an_approval_request_expires_its_ttl_from_now() -> None:
    from tether.approvals import ApprovalRequest
    from tether.messages import ToolCall

    request = ApprovalRequest.for_call(ToolCall("c1", "pay", {"amount": 5}), ttl=60)
    assert request.expires_at is not None and 50 < request.expires_at - time.time() <= 60
    assert ApprovalRequest.for_call(ToolCall("c2", "pay", {}), ttl=None).expires_at is None


def test_the_journal_holds_no_file_for_a_run_that_waits_in_the_queue(tmp_path: Path) -> None:
    """A page's server journals every run; a run queued for a slot held its file open for as
    long as it waited, so 10,000 queued runs held 10,000 descriptors. Its file is let go while
    it waits, and its later events are still all there."""
    from tether.events import Event
    from tether.journal import Journal

    journal = Journal(tmp_path)
    for i in range(3):
        journal.write(Event("run_started", f"r{i}", 0, {"task": "t"}))
        journal.write(Event("queued", f"r{i}", 1, {"what": "run", "position": i + 1}))
    assert journal.files == {}
    journal.write(Event("admitted", "r0", 2, {"what": "run"}))
    assert list(journal.files) == ["r0"]
    journal.close()
    assert [e.type for e in journal.runs()["r0"]] == ["run_started", "queued", "admitted"]


async def test_a_runtime_in_memory_has_a_view_of_its_runs_as_a_store_has() -> None:
    """One interface for reading runs, in memory too (it was None, and each reader asked
    first whether there was a store): a run waiting for approval is listed `waiting` (as a
    store lists it; in memory it said `running`), in the page of that state and its counts;
    one that is not there is NoSuchRun."""
    from tether import Runtime
    from tether.overview import Overview
    from tether.run_filter import RunFilter

    script = [reply(tool_calls=[("pay", {"amount": 5, "to": "bob"})]), reply("Paid.")]
    agent = Agent(ScriptedModel(script), [pay], name="payer")
    async with Runtime(agents=[agent]) as rt:
        run = await rt.start("payer", "Pay bob.")
        await until(lambda: rt.get(run.id).waiting(), "the call to wait for approval", 10)
        assert rt.view.has(run.id) and rt.view.rows() == [] and rt.view.row(run.id) is None
        waiting = rt.view.page(RunFilter(states=frozenset({"waiting"})), None, 10)
        assert [r["id"] for r in waiting.rows] == [run.id]
        assert waiting.counts == {"waiting": 1}
        listed = await Overview(rt).page(RunFilter(), None, 10)
        assert [(r["id"], r["status"]) for r in listed.rows] == [(run.id, "waiting")]
        (request,) = rt.get(run.id).waiting()
        rt.approve(run.id, request.id)
        done = await within(run.wait(), "the approved run")
        assert done.answer == "Paid."
        assert rt.view.page(RunFilter(), None, 10).rows[0]["status"] == "done"
        with pytest.raises(NoSuchRun):
            rt.view.log("nope")


async def test_a_runtime_s_own_task_that_fails_is_logged_and_closing_ends_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Work of the runtime's own (an MCP server's holder, a store's follower): one that fails
    is logged once with its error (it was an exception nobody retrieved), and closing the
    runtime cancels the one still waiting."""
    import gc
    import logging

    from tether import Runtime

    unhandled: list[str] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, c: unhandled.append(c["message"]))

    async def fails() -> None:
        raise ValueError("the server went away")

    waited = asyncio.Event()

    async def waits() -> None:
        await waited.wait()

    with caplog.at_level(logging.ERROR, logger="tether"):
        async with Runtime() as rt:
            failing, waiting = rt.spawn(fails()), rt.spawn(waits())
            await asyncio.wait([failing])
            await asyncio.sleep(0)
        assert waiting.cancelled()
        del failing
        gc.collect()
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("the server went away",)]
    assert unhandled == []


async def test_background_work_cancelled_before_it_began_is_closed_not_left_unawaited() -> None:
    """A runtime that closes cancels its background work; work cancelled before its first
    step (an MCP connection asked for just as the runtime closed) must be closed, or Python
    warns that a coroutine was never awaited and its cleanup never runs."""
    import inspect

    from tether.background import Background

    async def work() -> None:
        await asyncio.sleep(0)

    background = Background()
    coroutine = work()
    task = background.spawn(coroutine)
    task.cancel()  # before the loop ran it once
    with pytest.raises(asyncio.CancelledError):
        await task
    assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
    await background.close()


# -- memory ----------------------------------------------------------------------------------


async def test_an_ended_run_leaves_no_reference_cycle_for_the_collector() -> None:
    """What a run made is freed as soon as nothing refers to it, not by the cyclic garbage
    collector: each cycle a run leaves is work for every full collection of the host's
    process (its run context once held its own model, and through it the run's emitter and
    event log: 17 objects a run waited for the collector)."""
    import gc

    from tether import Runtime

    @tool
    async def look(ctx: RunContext, path: str) -> str:
        """Look at a path."""
        return f"{path} in {ctx.run_id}"

    calls = [("look", {"path": "a"}), ("look", {"path": "b"})]
    model = ScriptedModel([reply(tool_calls=calls), reply("seen")])
    async with Runtime(agents=[Agent(model, [look], name="looker")], keep_finished=0) as rt:
        first = await rt.start("looker", "look")  # a first run warms caches
        await first.wait()
        del first
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            run = await rt.start("looker", "look")
            result = await run.wait()
            del run
            await asyncio.sleep(0)
            gc.collect()
            left = [type(o).__qualname__ for o in gc.garbage if made_by_tether(o)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert result.outcome == "done" and result.answer == "seen"
    assert left == []


def made_by_tether(o: object) -> bool:
    """Whether `o` is Tether's: of a Tether type, or a coroutine, frame or function of Tether's
    code. The collector's garbage is the whole process's: DBOS, once a durable test of the same
    worker launched it, stays for the process, and its queue thread's SQLAlchemy queries made
    cycles of their own meanwhile."""
    if (type(o).__module__ or "").startswith("tether"):
        return True
    if isinstance(o, types.CoroutineType):
        code = o.cr_code
    elif isinstance(o, types.GeneratorType):
        code = o.gi_code
    elif isinstance(o, types.FrameType):
        code = o.f_code
    elif isinstance(o, types.FunctionType):
        code = o.__code__
    else:
        return False
    return f"{os.sep}tether{os.sep}" in code.co_filename


async def test_an_ended_run_kept_compact_answers_as_it_did() -> None:
    """An ended run the runtime keeps (10,000 by default) still answers with its transcript
    and result, equal to what `wait` returned, while it holds them compact (`compact.py`)."""
    from tether import Runtime

    @tool
    async def look(path: str) -> str:
        """Look at a path."""
        return f"{path}: a file"

    calls = [("look", {"path": "a"}), ("look", {"path": "b"})]
    model = ScriptedModel([reply(tool_calls=calls), reply("seen")])
    async with Runtime(agents=[Agent(model, [look], name="looker")]) as rt:
        run = await rt.start("looker", "look")
        result = await run.wait()
        await asyncio.sleep(0)
        kept = rt.get(run.id)
        assert kept.result == result and kept.result is not result
        assert kept.transcript == result.messages
        assert [m.role for m in kept.transcript] == ["user", "assistant", "tool", "assistant"]
        assert kept.transcript[2].tool_results[1].output == "b: a file"
        assert await kept.wait() == result
        kept.transcript.clear()  # a reader's list is its own
        assert kept.transcript == result.messages
        assert isinstance(run, Run) and isinstance(run.kept, bytes)  # no message objects
        with pytest.raises(RunEnded):
            kept.send("more?")
        with pytest.raises(ApprovalError, match="'ap_x' is not waiting"):
            kept.approve("ap_x")
        assert kept.waiting() == [] and kept.transcript == result.messages


async def test_a_cancelled_waiter_leaves_the_run_and_its_other_waiters_alone() -> None:
    """`wait` from many places at once: one waiter given up on (a page closed, a timeout)
    neither cancels the run nor wakes the others early; each gets the run's result."""
    gate = asyncio.Event()

    async def held(request: ModelRequest) -> ModelResponse:
        await gate.wait()
        return reply("finished")

    run = Supervisor().start(Agent(ScriptedModel([held])), "wait for the gate")
    impatient = asyncio.create_task(run.wait())
    patient = asyncio.create_task(run.wait())
    await until(lambda: events(run, "model_request"), "the model call")
    impatient.cancel()
    with pytest.raises(asyncio.CancelledError):
        await impatient
    assert run.alive and not patient.done()
    gate.set()
    result = await patient
    assert (result.outcome, result.answer) == ("done", "finished")
    assert (await run.wait()).answer == "finished"  # after the end, at once
    assert run.cancel() is False


async def test_a_run_cancelled_before_its_task_began_ends_cancelled() -> None:
    """Cancelled at once after `start`, before the event loop ran its task: it stayed
    `queued` and alive for good, with no `run_finished`, and `wait` raised CancelledError."""
    sup = Supervisor(keep_finished=0)
    run = sup.start(Agent(ScriptedModel([reply("never said")])), "too late")
    assert run.cancel()  # before the event loop ever ran the run's task
    result = await asyncio.wait_for(run.wait(), 5)
    assert result.outcome == "cancelled" and result.answer == ""
    assert run.status == "cancelled" and not run.alive and run.log.closed
    assert [e.type for e in events(run)] == ["run_finished"]
    assert events(run)[-1].data["outcome"] == "cancelled"
    assert run.id not in sup.runs  # forgotten as every ended run is, past `keep_finished`
