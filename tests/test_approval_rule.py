"""One rule for an answer to an approval, wherever the run is: in memory (`ApprovalDesk`), a
durable run of this process (`DurableRun.answer`), and one answered from another process
(`tether approve`'s `answer_approval`). Each copy is given the same answers: an approval
never asked, one with another call's arguments, and a second decision of a call being run.
Each says the same, and names the approval by its call (`ap_<call id>`).

Each case runs in a process of its own (DBOS stays launched in the process that opened a
store)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import warm

ANSWERS = """
import asyncio, json, sys
from tether import Agent, Runtime, ScriptedModel, reply, tool
from tether.errors import ApprovalError, TetherError

mode, store = sys.argv[1], (sys.argv[2] if sys.argv[1] != "memory" else None)
started, release = asyncio.Event(), asyncio.Event()

@tool(approval="always")
async def pay(amount: int, to: str) -> str:
    \"\"\"Pay an amount to someone.\"\"\"
    started.set()
    await release.wait()
    return f"paid {amount} to {to}"

async def main():
    model = ScriptedModel([reply(tool_calls=[("pay", {"amount": 5, "to": "ann"})]), reply("Paid.")])
    said = {}
    async with Runtime(store, [Agent(model, [pay], name="payer")]) as rt:
        run = await rt.start("payer", "pay ann", run_id="pay-1")
        while not run.waiting():
            await asyncio.sleep(0.02)
        (request,) = run.waiting()

        def answer(approval_id, args_hash=None):
            try:
                if mode == "outside":
                    from tether.durable.remote import answer_approval
                    from tether.durable.view import client
                    reply_ = {"approved": True, "reason": "approved by the user"}
                    answer_approval(client(store), run.id, approval_id, reply_, args_hash)
                else:
                    rt.approve(run.id, approval_id, args_hash)
                return "taken"
            except TetherError as e:
                return f"{type(e).__name__}: {e}"

        said["id"] = (request.id, request.call.id)
        said["never asked"] = answer("ap_never")
        said["other arguments"] = answer(request.id, "0" * 64)
        said["first"] = answer(request.id, request.args_hash)
        await started.wait()  # the call runs: its approval was taken
        said["second"] = answer(request.id, request.args_hash)
        release.set()
        said["answer"] = (await run.wait()).answer
    print(json.dumps(said), flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["memory", "here", "outside"])
def test_every_copy_answers_an_approval_by_one_rule(mode: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ANSWERS, mode, f"sqlite:///{tmp_path}/runs.sqlite"],
        capture_output=True,
        text=True,
        timeout=120,
        env=warm.cli_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    approval_id, call_id = said["id"]
    assert approval_id == f"ap_{call_id}"
    assert said["never asked"] == (
        "ApprovalError: approval 'ap_never' is not waiting: it was never asked, or it expired"
    )
    assert said["other arguments"] == (
        f"ApprovalError: approval {approval_id!r} was shown other arguments"
    )
    assert said["first"] == "taken"
    assert said["second"] == (
        f"ApprovalError: approval {approval_id!r} was approved already: approved by the user"
    )
    assert said["answer"] == "Paid."
