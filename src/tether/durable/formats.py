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
"""

WORKFLOW_VERSION = "tether-4"
RECORD_FORMAT = b"tether-json-1\n"
RUN_FORMAT = 1
