"""A lead agent fans a question out to researcher agents, then writes the answer.

    python examples/research_tree.py "How do tides work?"                 # offline, scripted
    OPENAI_API_KEY=sk-... python examples/research_tree.py "How do tides work?"
    python examples/research_tree.py "..." --store sqlite:///tree.sqlite  # a durable root
    python examples/research_tree.py "..." --json                         # the tree's events

Each researcher is a child run of the lead (`Agent.as_tool`): the lead's calls to it run side
by side, each child's events carry `parent_run_id` and `root_run_id`, and the lead's budget
(`--max-steps`, 9 by default) covers every model call of the tree: 3 researchers each making 2
calls and the lead's 2 make 8. Try `--max-steps 5` to see the tree halt with the reason.

Without OPENAI_API_KEY the model is a script that plays both roles; with it, the agents use
OpenAI's Chat Completions API (`--model`, or any compatible server at $OPENAI_BASE_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from tether import (
    Agent,
    Budget,
    Event,
    ModelRequest,
    OpenAIChatModel,
    Runtime,
    ScriptedModel,
    reply,
    tool,
)

NOTES = {
    "gravity": "The Moon's gravity pulls the ocean towards it, and the Earth away from the "
    "water on the far side: two bulges.",
    "rotation": "The Earth turns under the two bulges once a day: most coasts see two high "
    "tides about 12 h 25 min apart.",
    "sun": "The Sun adds its pull: in line with the Moon it makes spring tides, at right "
    "angles neap tides.",
}


@tool
def look_up(subject: str) -> str:
    """Look a subject up in the library (a canned table, for the example).

    Args:
        subject: One word: gravity, rotation or sun.
    """
    return NOTES.get(subject.strip().lower(), "nothing on that subject")


LEAD = (
    "You are the lead. Split the question into at most three subjects, hand each to the "
    "researcher at once (parallel calls), then answer from what they found, in a few sentences."
)
RESEARCHER = "You are a researcher. Look your subject up, then say what you found in one sentence."


def scripted(request: ModelRequest) -> Any:
    """Both roles, offline: the lead fans out, then joins; a researcher looks up, then tells."""
    results = [p for m in request.messages if m.role == "tool" for p in m.parts]
    if request.system == LEAD:
        if not results:
            return reply(tool_calls=[("researcher", {"task": s}) for s in NOTES])
        return reply(" ".join(str(getattr(r, "output", "")) for r in results))
    if not results:
        return reply(tool_calls=[("look_up", {"subject": request.messages[0].text})])
    return reply(str(getattr(results[0], "output", "")))


def model(name: str) -> Any:
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
        return OpenAIChatModel(name, api_key=key, base_url=url)
    return ScriptedModel([scripted] * 64)


def printer(as_json: bool) -> Any:
    def show(event: Event) -> None:
        if as_json:
            print(event.to_json().decode(), flush=True)
        elif event.type == "tool_call":
            print(f"{event.run_id}: {event.data['name']}({event.data['arguments']})", flush=True)
        elif event.type == "run_finished":
            print(f"{event.run_id}: {event.data['outcome']} {event.data['reason']}", flush=True)

    return show


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("question")
    parser.add_argument("--model", default="gpt-4.1-mini")
    parser.add_argument("--max-steps", type=int, default=9)
    parser.add_argument("--store", default=None, help="sqlite:///PATH or postgresql://...")
    parser.add_argument("--json", action="store_true", help="the tree's events as JSON lines")
    args = parser.parse_args(argv)
    shared = model(args.model)
    researcher = Agent(shared, [look_up], system=RESEARCHER, name="researcher")
    lead = Agent(
        shared,
        [researcher.as_tool(description="Research one subject and say what you found.")],
        system=LEAD,
        name="lead",
        budget=Budget(max_steps=args.max_steps),
    )
    async with Runtime(store=args.store, agents=[lead, researcher]) as rt:
        run = await rt.start("lead", args.question, sinks=[printer(args.json)])
        result = await run.wait()
    await shared.aclose()
    assert result is not None
    if not args.json:
        print(f"\n{result.answer or result.reason}")
    return result.exit_status


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
