"""Tasks written the way authors write them for Docker, one per way a real task set failed in
the sandbox (`pip install` at build, `${PATH}` in `ENV`, a multi-stage build, a service the
entrypoint starts, a task that kills every Python, the host's `/opt`, a copy into a directory
of the image, a compose file of the task's own container only): each scores 1 with its oracle
and 0 with nothing done, as under Docker (#58)."""

from __future__ import annotations

from pathlib import Path

from test_harbor import harbor_run, needs_bwrap, rewards  # skips this module as it skips its own

DOCKER_TASKS = Path(__file__).parent / "fixtures" / "harbor-docker"
NAMES = sorted(p.name for p in DOCKER_TASKS.iterdir() if (p / "task.toml").exists())


@needs_bwrap
def test_tasks_written_for_docker_score_as_under_docker(tmp_path: Path) -> None:
    oracle = harbor_run(tmp_path / "oracle", "--agent", "oracle", tasks=DOCKER_TASKS)
    nop = harbor_run(tmp_path / "nop", "--agent", "nop", tasks=DOCKER_TASKS)
    failed = {n: oracle[n].get("exception_info") for n in NAMES if rewards(oracle)[n] != 1.0}
    assert rewards(oracle) == dict.fromkeys(NAMES, 1.0), failed
    assert rewards(nop) == dict.fromkeys(NAMES, 0.0)


def test_an_environment_never_started_leaves_nothing_in_tmp(tmp_path: Path) -> None:
    """Harbor makes environments it never starts: each left an empty, private directory in
    /tmp (twelve after one test run here). The scratch directory is made at start, 0700."""
    import asyncio
    import stat

    from test_harbor import environment
    from tether.harbor.environment import LocalEnvironment

    (tmp_path / "environment").mkdir()
    idle = environment(tmp_path)
    assert not idle.root.exists()
    used = environment(tmp_path)
    assert isinstance(used, LocalEnvironment)
    asyncio.run(used.start(force_build=False))
    try:
        assert stat.S_IMODE(used.root.stat().st_mode) == 0o700
    finally:
        asyncio.run(used.stop(delete=True))
    assert not used.root.exists() and not idle.root.exists()
