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
keeps a workflow's arguments as a list, and four readers took them by position. Its record is
a `RunRecord`, a typed value: it is written as the same JSON object it always was (runs kept
before it are read as they are), and every reader names its fields, where 32 sites read a dict
with `.get` and each decided alone what a missing key meant.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from ..messages import ImagePart

WORKFLOW_VERSION = "tether-4"
RECORD_FORMAT = b"tether-json-1\n"
RUN_FORMAT = 1


@dataclasses.dataclass(frozen=True, slots=True)
class RunRecord:
    """What a store keeps of a run besides its task (`run.record_of` builds it): its agent (by
    name, and the options it was built from when it was), how approvals are decided, its
    restart policy, the JSON parts of its tools' context, and where it came from. Nothing here
    depends on how a command line spells its flags."""

    agent: str | None = None
    version: str | None = None
    """The agent's version it started with (None: recorded before runs had versions)."""
    options: dict[str, Any] | None = None
    """The options its agent was built from (`tether run`), which any worker builds again;
    None for a registered agent's run."""
    approvals: str = "wait"
    """`wait` for a person, `auto` or `deny` every call that asks."""
    restart: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Its `RestartPolicy`'s fields (empty: the default one)."""
    workspace: str | None = None
    account_id: str | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    provider: str | None = None
    model: str | None = None
    parent_run_id: str | None = None
    root_run_id: str | None = None
    forked_from: str | None = None
    """A fork's origin: the run it was forked from, and at which step (`at`)."""
    at: int | None = None
    images: tuple[ImagePart, ...] = ()
    """The task's images, without their bytes (kept beside the record, by their sha256)."""
    format: int | None = None
    """`RUN_FORMAT` when it was written by this code (`run.record_of`); a worker refuses
    another, and a record without one is not a run's."""

    @classmethod
    def of(cls, data: Any) -> RunRecord:
        """The record a store keeps as JSON; a field missing or of the wrong type reads as its
        default (None: the run does not say), so an older record reads as what it says."""
        d = data if isinstance(data, dict) else {}

        def text(key: str) -> str | None:
            value = d.get(key)
            return value if isinstance(value, str) else None

        def mapping(key: str) -> dict[str, Any] | None:
            value = d.get(key)
            return dict(value) if isinstance(value, dict) else None

        at, form, images = d.get("at"), d.get("format"), d.get("images")
        return cls(
            agent=text("agent"),
            version=text("version"),
            options=mapping("options"),
            approvals=text("approvals") or "wait",
            restart=mapping("restart") or {},
            workspace=text("workspace"),
            account_id=text("account_id"),
            config=mapping("config") or {},
            provider=text("provider"),
            model=text("model"),
            parent_run_id=text("parent_run_id"),
            root_run_id=text("root_run_id"),
            forked_from=text("forked_from"),
            at=at if isinstance(at, int) else None,
            images=tuple(map(ImagePart.from_ref, images)) if isinstance(images, list) else (),
            format=form if isinstance(form, int) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object a store keeps: the keys it always had, and a child's lineage, a
        fork's origin and a task's images only where there are some."""
        out: dict[str, Any] = {
            "format": self.format,
            "agent": self.agent,
            "version": self.version,
            "options": self.options,
            "approvals": self.approvals,
            "restart": self.restart,
            "workspace": self.workspace,
            "account_id": self.account_id,
            "config": self.config,
            "provider": self.provider,
            "model": self.model,
        }
        out.update(self.lineage)
        out.update(self.origin)
        if self.images:
            out["images"] = [i.ref for i in self.images]
        return out

    @property
    def lineage(self) -> dict[str, str]:
        """A child run's `parent_run_id` and `root_run_id` (empty for a root)."""
        if self.parent_run_id is None:
            return {}
        return {"parent_run_id": self.parent_run_id, "root_run_id": self.root_run_id or ""}

    @property
    def origin(self) -> dict[str, Any]:
        """A fork's `forked_from` and `at` (empty for a run that is not a fork)."""
        if self.forked_from is None:
            return {}
        return {"forked_from": self.forked_from, "at": self.at}


class WorkflowInput(NamedTuple):
    """The arguments a run's workflow was started with (`process.workflow`), in their order:
    its id, its record (agent, version, options, policies: `RUN_FORMAT`), its task (None: a
    fork that goes on with no new message) and the conversation before the task."""

    run_id: str
    record: RunRecord
    task: str | None
    history: list[Any]

    @classmethod
    def of(cls, status: Any) -> WorkflowInput | None:
        """The input of a DBOS workflow status read with its input; None when it has none
        (read without it, or not a run of Tether's)."""
        given = status.input.get("args") if isinstance(status.input, dict) else None
        if not isinstance(given, (list, tuple)) or len(given) < 3:
            return None
        history = given[3] if len(given) > 3 and given[3] else []
        return cls(str(given[0]), RunRecord.of(given[1]), given[2], list(history))
