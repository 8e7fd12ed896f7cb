"""Durable runs on DBOS Transact: a run is a workflow; its model calls and tool calls are steps.

    async with Runtime(store="sqlite:///runs.sqlite", agents=[agent]) as rt:  (see runtime.py)
        run = await rt.start("billing", "Charge order A-7", run_id="a-7")   (kill -9 it anywhere)
    ... await rt.resume("a-7")                                  (no completed step repeats)

A run on a store runs the same driver as a run in memory (`agent.execute`) under the same
supervision loop (`run.supervise`); what differs is how an effect is performed: each is a step
recorded in the store, so a run survives a crash without repeating what it completed. DBOS keeps
the run's life (its start, end and status, recovery, queues, durable messages for approvals);
the steps and the journal of tool calls are kept beside DBOS's tables, in the ledger, which costs
a fraction of a DBOS step. What is persisted is what completed: each model reply and each tool
result (token deltas are only streamed live).

The package, from the bottom:

    records.py       values as JSON records (never a pickle): what every table below holds
    steps.py         a run's recorded steps as typed values (model, context, tools, inbox, guard)
    sqlite.py        SQLite tuned for Tether's own connections only
    outage.py        a store that stops answering: patience, and what is said of it
    dbos_private.py  every use of DBOS's private API, in one place
    ledger.py        the steps, the journal of tool calls, the inbox, images, workers' beats
    view.py          a store read from outside: runs listed, their status, events, transcripts
    remote.py        a store acted on from outside: approvals, messages, answers, the queue;
                     a run executed elsewhere followed as a handle
    run.py           one run here: its record, its handle, what its execution keeps
    effects.py       the driver's effects as recorded steps (a replay gets the same answers)
    execute.py       the workflow's body: the run's agent found again, then `supervise`
    process.py       this process's side of a store: DBOS launched, runs started, followed,
                     resumed, cancelled, watched
    workers.py       `tether worker`: queued runs taken, beats, the dead's runs recovered
    migrate.py       `tether migrate`: a store written by an earlier version made current

Tools get an idempotency key (`run_id:call_id`, in `RunContext.idempotency_key`) for the
at-least-once window that remains (the moment between a tool's effect and its journal entry).
SQLite stores need SQLite 3.42 or newer (DBOS uses `unixepoch('subsec')`); where Python's own is
older, the bundled one of `pysqlite3-binary` is used, for Tether's connections only.
"""
