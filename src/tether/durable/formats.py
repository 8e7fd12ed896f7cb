"""The versions of what a store keeps, in one place: bump one when what it names changes, and
say in `migrate.py` (or the changelog) what becomes of what was kept before.

- `WORKFLOW_VERSION`: the shape of a run's workflow (its steps, their order and records). DBOS
  keeps it with every run; a run recorded under another is not resumed by this code (its
  steps would be read as other steps), and says so.
- `RECORD_FORMAT`: how a record (a step's output, a run's input and result) is written, the
  first bytes of each; one without them (a pickle of an earlier version) is refused.
- `RUN_FORMAT`: the fields of a run's record (its agent, options, context, policies); a
  worker refuses a run whose record is of another.

A built Harbor image has its own (`harbor.build.LAYOUT`): it lives in a cache, not a store.

What a run's workflow is started with (`WorkflowInput`) is read back here too, by name: DBOS
keeps a workflow's arguments as a list, and four readers took them by position.
"""

from __future__ import annotations

from typing import Any, NamedTuple

WORKFLOW_VERSION = "tether-4"
RECORD_FORMAT = b"tether-json-1\n"
RUN_FORMAT = 1


class WorkflowInput(NamedTuple):
    """The arguments a run's workflow was started with (`process.workflow`), in their order:
    its id, its record (agent, version, options, policies: `RUN_FORMAT`), its task (None: a
    fork that goes on with no new message) and the conversation before the task."""

    run_id: str
    record: dict[str, Any]
    task: str | None
    history: list[Any]

    @classmethod
    def of(cls, status: Any) -> WorkflowInput | None:
        """The input of a DBOS workflow status read with its input; None when it has none
        (read without it, or not a run of Tether's)."""
        given = status.input.get("args") if isinstance(status.input, dict) else None
        if not isinstance(given, (list, tuple)) or len(given) < 3:
            return None
        record = given[1] if isinstance(given[1], dict) else {}
        history = given[3] if len(given) > 3 and given[3] else []
        return cls(str(given[0]), record, given[2], list(history))
