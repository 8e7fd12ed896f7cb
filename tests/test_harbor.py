"""Tether on Harbor, offline: the full `harbor run` path over the shipped tasks with the local
environment, plus the environment and the agent's record of a run cut short."""

from __future__ import annotations

import asyncio
import functools
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # importing harbor must not fetch

try:
    from harbor.models.agent.context import AgentContext
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths
except ImportError as e:  # the harbor extra is not installed
    if os.environ.get("TETHER_REQUIRE_HARBOR"):
        raise
    pytest.skip(f"harbor is not installed: {e}", allow_module_level=True)

from helpers import alive, until, wait_until
from tether.harbor import environment as environment_module
from tether.harbor.agent import TRAJECTORY, TetherAgent
from tether.harbor.environment import LocalEnvironment
from tether.harbor.rootfs import CONTAINER_CAPABILITIES
from tether.harbor.sandbox import SandboxEnvironment
from tether.harbor.sandbox import available as sandbox_available
from tether.terminal import TERMINAL_CHECK

bash_module = importlib.import_module("tether.tools.bash")  # `tether.tools.bash` is the tool

TASKS = Path(__file__).parent.parent / "examples" / "terminal-tasks"
SCRIPT = TASKS / "scripted.json"
HARBOR = str(Path(sys.executable).with_name("harbor"))
NAMES = sorted(p.name for p in TASKS.iterdir() if (p / "task.toml").exists())


needs_bwrap = pytest.mark.skipif(
    not sandbox_available() and not os.environ.get("TETHER_REQUIRE_SANDBOX"),
    reason="needs bubblewrap (apt-get install bubblewrap)",
)


def harbor_run(
    jobs: Path,
    *args: str,
    tasks: Path = TASKS,
    env_class: str = "tether.harbor.sandbox:SandboxEnvironment",
) -> dict[str, dict[str, Any]]:
    """Run `harbor run` over the shipped tasks (or `tasks`), each trial in its sandbox (or
    `env_class`); each trial's result.json, by task name."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env["XDG_CACHE_HOME"] = str(jobs.parent / "cache")  # built images: the test's own
    cmd = [HARBOR, "run", "--path", str(tasks), "-o", str(jobs), "-y", "-q"]
    cmd += ["--env", env_class, *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = {}
    for path in jobs.glob("*/*/result.json"):
        result = json.loads(path.read_text())
        results[result["task_name"]] = {**result, "dir": path.parent}
    names = sorted(p.name for p in tasks.iterdir() if (p / "task.toml").exists())
    assert sorted(results) == names, done.stdout[-3000:]
    return results


def observations(trajectory: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for s in trajectory["steps"] for o in s.get("observation", {}).get("results", [])]


def rewards(results: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    return {
        name: (r.get("verifier_result") or {}).get("rewards", {}).get("reward")
        for name, r in results.items()
    }


def test_eight_offline_tasks_ship_written_as_for_docker() -> None:
    """Each with its parts, its scripts naming the container's paths themselves (no
    `$APP_DIR` stand-ins), three of them needing several commands and a check."""
    assert len(NAMES) >= 8
    for name in NAMES:
        for part in ("instruction.md", "task.toml", "tests/test.sh", "solution/solve.sh"):
            assert (TASKS / name / part).is_file(), f"{name}/{part}"
        for script in (TASKS / name).rglob("*.sh"):
            assert "_DIR" not in script.read_text(), script
        assert "/logs/verifier/reward.txt" in (TASKS / name / "tests/test.sh").read_text()


@needs_bwrap
def test_tether_solves_every_task_through_harbor_run(tmp_path: Path) -> None:
    results = harbor_run(
        tmp_path,
        "--agent",
        "tether.harbor.agent:TetherAgent",
        "--model",
        "scripted",
        "--ak",
        f"script={SCRIPT}",
    )
    assert rewards(results) == dict.fromkeys(NAMES, 1.0)
    for name, r in results.items():
        assert r["exception_info"] is None, name
        context = r["agent_result"]
        assert context["n_input_tokens"] > 0 and context["n_output_tokens"] > 0, name
        assert context["metadata"]["outcome"] == "done"
        trajectory = json.loads((r["dir"] / "agent" / TRAJECTORY).read_text())
        assert trajectory["schema_version"] == "ATIF-v1.4"
        assert trajectory["agent"]["name"] == "tether"
        assert trajectory["final_metrics"]["total_prompt_tokens"] == context["n_input_tokens"]
        calls = [c for s in trajectory["steps"] for c in s.get("tool_calls", [])]
        observed = observations(trajectory)
        assert calls and len(observed) == len(calls), name
        assert trajectory["steps"][0]["source"] == "user"
        asked = [s for s in trajectory["steps"] if s["source"] == "user"][1:]
        assert [s["message"] for s in asked] == [TERMINAL_CHECK], name  # checked once


@needs_bwrap
def test_the_tasks_fail_when_nothing_is_done_and_pass_with_their_solutions(
    tmp_path: Path,
) -> None:
    """The verifiers are real: Harbor's do-nothing agent scores 0 on every task, its oracle
    (the task's solution/solve.sh) 1, and no process a task started outlives its trial."""
    assert rewards(harbor_run(tmp_path / "nop", "--agent", "nop")) == dict.fromkeys(NAMES, 0.0)
    assert rewards(harbor_run(tmp_path / "oracle", "--agent", "oracle")) == dict.fromkeys(
        NAMES, 1.0
    )
    leftover = subprocess.run(["pgrep", "-f", "/app/spinner.sh"], capture_output=True)
    assert leftover.stdout == b""


FLAWS = Path(__file__).parent / "fixtures" / "harbor-flaws"
"""Tasks that score 1 under Harbor's docker environment, one for each way ours once differed."""

ENVIRONMENTS = [
    pytest.param("tether.harbor.sandbox:SandboxEnvironment", marks=needs_bwrap, id="sandbox"),
    pytest.param("tether.harbor.environment:LocalEnvironment", id="local"),
]


@pytest.mark.parametrize("env_class", ENVIRONMENTS)
def test_tasks_get_what_docker_gives_them_or_are_refused_at_start(
    tmp_path: Path, env_class: str
) -> None:
    """A task's `[solution.env]` (which Harbor scopes onto the oracle's commands, as it scopes
    `--ae` onto an agent's) reaches the command; its Dockerfile's ENV, ARG, WORKDIR and COPY
    shape the trial (and the Dockerfile itself is not in the workdir); a task whose compose
    file starts services (or, in the sandbox, that asks for the internet) is refused at start
    with the reason, not scored a silent 0; one whose agent runs as a user of its image runs
    as that user in the sandbox, and fails saying so in the local environment instead of
    running as root."""
    oracle = harbor_run(tmp_path / "oracle", "--agent", "oracle", tasks=FLAWS, env_class=env_class)
    nop = harbor_run(tmp_path / "nop", "--agent", "nop", tasks=FLAWS, env_class=env_class)
    for name in ("solution-env", "dockerfile"):
        assert rewards(oracle)[name] == 1.0, name
        assert rewards(nop)[name] == 0.0, name
    for results in (oracle, nop):
        refused = results["services"]
        assert refused["verifier_result"] is None
        why = refused["exception_info"]["exception_message"]
        assert "docker-compose.yaml starts services" in why
    # a task that says it needs the internet: the sandbox has none and says so at start; the
    # local environment has the host's
    if "sandbox" in env_class:
        refused = oracle["internet"]
        assert refused["verifier_result"] is None
        assert "asks for the internet" in refused["exception_info"]["exception_message"]
        assert "--ek network=true" in refused["exception_info"]["exception_message"]
    else:
        assert rewards(oracle)["internet"] == 1.0 and rewards(nop)["internet"] == 0.0
    # a task whose agent runs as a user its image adds: in the sandbox its RUN is run and the
    # agent is that user; the local environment refuses it, never runs it as root instead
    if "sandbox" in env_class and os.geteuid() == 0:
        assert rewards(oracle)["other-user"] == 1.0
        assert rewards(nop)["other-user"] == 0.0
    else:
        other = oracle["other-user"]
        assert rewards(oracle)["other-user"] != 1.0
        assert "as user 'tester'; this" in other["exception_info"]["exception_message"]


ROOT_TASKS = Path(__file__).parent / "fixtures" / "harbor-root"
"""Tasks that write to the system as an agent in a container does: the sandbox only (the local
environment would write to this machine's)."""


@needs_bwrap
def test_a_task_writes_to_its_own_system_and_the_host_never_changes(tmp_path: Path) -> None:
    """In a container an agent installs a command into /usr/local/bin, adds a user and writes
    to its home, and a verifier renames /tests to hide it; a task's image installs a program
    and adds a user (its Dockerfile's RUN) that the agent switches to; an image's ENTRYPOINT
    starts what the task needs: each scores 1 in the sandbox, and none of it reaches this
    machine."""
    oracle = harbor_run(tmp_path / "oracle", "--agent", "oracle", tasks=ROOT_TASKS)
    nop = harbor_run(tmp_path / "nop", "--agent", "nop", tasks=ROOT_TASKS)
    for name in ("writable-root", "dockerfile-run", "entrypoint"):
        assert rewards(oracle)[name] == 1.0, oracle[name]["dir"]
        assert rewards(nop)[name] == 0.0
    assert not Path("/usr/local/bin/greet").exists()
    for user in ("tester", "player"):
        assert subprocess.run(["getent", "passwd", user], capture_output=True).returncode != 0


# -- the environments, directly --------------------------------------------------------------


def environment(
    tmp_path: Path,
    workdir: str | None = None,
    kind: type[LocalEnvironment] = LocalEnvironment,
    **given: Any,
) -> LocalEnvironment:
    """An environment of `kind` for the task in `tmp_path`; `given`: its `--ek` options."""
    env_dir = tmp_path / "environment"
    env_dir.mkdir(exist_ok=True)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    return kind(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t__x__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(workdir=workdir),
        **given,
    )


def test_container_paths_map_into_the_scratch_directory(tmp_path: Path) -> None:
    env = environment(tmp_path, workdir="/srv/work")
    root = env.root
    assert env.rewrite("bash /tests/test.sh > /logs/verifier/out.txt 2>&1") == (
        f"bash {root}/tests/test.sh > {root}/logs/verifier/out.txt 2>&1"
    )
    assert env.rewrite("cd /srv/work && ls") == f"cd {root}/app && ls"
    # not a container path: part of another path, a longer name, a variable
    for untouched in ("ls /usr/app /applications ./logs x/tests", "echo $HOME/logs", "/appx"):
        assert env.rewrite(untouched) == untouched
    assert env.local("/logs/agent/a.txt") == root / "logs/agent/a.txt"
    assert env.local("notes.txt") == root / "app/notes.txt"
    assert env.local("/etc/hostname") == Path("/etc/hostname")


def test_exec_uploads_and_downloads_meet_in_the_same_places(tmp_path: Path) -> None:
    async def scenario() -> None:
        env = environment(tmp_path)
        await env.start(force_build=False)
        src = tmp_path / "in.txt"
        src.write_text("hello\n")
        await env.upload_file(src, "/tests/data/in.txt")
        result = await env.exec("cat /tests/data/in.txt; echo $TESTS_DIR; pwd", cwd="/tests")
        assert result.return_code == 0
        lines = (result.stdout or "").splitlines()
        assert lines == ["hello", str(env.root / "tests"), str(env.root / "tests")]
        await env.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
        await env.download_dir("/logs/verifier", tmp_path / "verifier")
        assert (tmp_path / "verifier" / "reward.txt").read_text() == "1\n"
        await env.stop(delete=True)
        assert not env.root.exists()

    asyncio.run(scenario())


def test_exec_timeout_kills_the_command_and_stop_kills_what_was_left_running(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        env = environment(tmp_path)
        await env.start(force_build=False)
        t0 = time.monotonic()
        result = await env.exec("sleep 30 & echo started; wait", timeout_sec=1)
        assert result.return_code == 124 and "started" in (result.stdout or "")
        assert time.monotonic() - t0 < 10
        await env.exec("setsid sleep 300 > /dev/null 2>&1 & echo $! > pid")
        pid = int((env.root / "app" / "pid").read_text())
        assert alive(pid)
        await env.stop(delete=True)
        await until(lambda: not alive(pid), "the left-over process to end", 5)

    asyncio.run(scenario())


def test_stop_kills_a_process_caught_between_exec_and_its_new_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A left-over process inside `execve` shows an empty environment for a moment, and a
    single look at /proc missed it (CI, 1 in 50 locally). Here the moment is held open: the
    process waits on a fifo with no environment, and is let go on to exec with the marker
    just after stop's first look."""
    env = environment(tmp_path)
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    marked = f"{environment_module.MARKER}={env.trial_marker}"
    proc = subprocess.Popen(
        ["env", "-i", "/bin/sh", "-c", f"read x < {fifo}; exec env {marked} sleep 300"]
    )
    cmdline = Path(f"/proc/{proc.pid}/cmdline")
    wait_until(lambda: cmdline.read_bytes().startswith(b"/bin/sh"), "env to exec the shell")
    looks = bash_module.marked_processes
    first = True

    def look_then_let_go(needle: set[bytes]) -> tuple[list[int], list[int]]:
        nonlocal first
        seen = looks(needle)
        if first:
            first = False
            assert proc.pid in seen[1]  # empty, so not killed on this look
            with fifo.open("w") as w:
                w.write("go\n")
            wait_until(
                lambda: cmdline.read_bytes().startswith(b"sleep"),
                "the process to exec sleep",
            )
        return seen

    monkeypatch.setattr(bash_module, "marked_processes", look_then_let_go)
    try:
        asyncio.run(env.stop(delete=True))
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()


def test_a_run_cut_short_by_harbor_keeps_its_trajectory_and_token_counts(
    tmp_path: Path,
) -> None:
    """Harbor cancels run() at the task's timeout and keeps what was written by then."""
    script = tmp_path / "script.json"
    second = "touch second; sleep 60"  # the call that is running at the cut
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "bash", "arguments": {"command": "echo step one"}}]},
                {"tool_calls": [{"name": "bash", "arguments": {"command": second}}]},
                {"text": "never reached"},
            ]
        )
    )

    async def scenario() -> tuple[AgentContext, dict[str, Any]]:
        env = environment(tmp_path)
        await env.start(force_build=False)
        agent = TetherAgent(tmp_path / "logs", "scripted", script=str(script))
        context = AgentContext()
        run = asyncio.create_task(agent.run("Do the thing.", env, context))
        trajectory = tmp_path / "logs" / TRAJECTORY
        await until((env.root / "app" / "second").exists, "the second call to be running")
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await env.stop(delete=True)
        return context, json.loads(trajectory.read_text())

    context, trajectory = asyncio.run(scenario())
    assert context.n_input_tokens and context.n_input_tokens > 0
    assert trajectory["final_metrics"]["extra"]["outcome"] == "cancelled"
    results = [o["content"] for o in observations(trajectory)]
    assert "step one" in results[0]
    assert len(results) == 2 and "Cancelled" in results[1]


def test_a_script_keyed_by_instruction_needs_exactly_one_match(tmp_path: Path) -> None:
    from tether.errors import ConfigError

    script = tmp_path / "s.json"
    script.write_text(json.dumps({"alpha": [{"text": "a"}], "beta": [{"text": "b"}]}))
    agent = TetherAgent(tmp_path, "scripted", script=str(script))
    assert agent.model_for("do alpha now") is not None
    with pytest.raises(ConfigError, match="0 entries match"):
        agent.model_for("do gamma")
    with pytest.raises(ConfigError, match="2 entries match"):
        agent.model_for("alpha and beta")
    with pytest.raises(ConfigError, match="base_url"):
        TetherAgent(tmp_path, "someprovider/model").model_for("x")


@needs_bwrap
def test_each_trial_starts_from_the_hosts_system_and_its_writes_go_with_it(
    tmp_path: Path,
) -> None:
    """A trial changes its system (a file in /etc, a program removed from /usr/bin, a file
    uploaded into /usr/local and one downloaded from /var, both through the sandbox since
    the kernel owns the mounted layers); the next trial of the same task starts from the
    host's system again, and the first's directory is gone with it."""
    (tmp_path / "environment").mkdir()
    given = tmp_path / "given.txt"
    given.write_text("uploaded\n")

    async def scenario() -> None:
        first = environment(tmp_path, kind=SandboxEnvironment)
        await first.start(force_build=False)
        try:
            r = await first.exec("echo changed > /etc/tether-trial && rm /usr/bin/env && date")
            assert r.return_code == 0, r.stderr
            await first.upload_file(given, "/usr/local/share/tether/given.txt")
            r = await first.exec("cat /usr/local/share/tether/given.txt; ls /usr/bin/env")
            assert r.stdout == "uploaded\n" and "No such file" in (r.stderr or "")
            await first.exec("mkdir -p /var/tmp/out && echo made > /var/tmp/out/made.txt")
            await first.download_dir("/var/tmp/out", tmp_path / "out")
            assert (tmp_path / "out" / "made.txt").read_text() == "made\n"
        finally:
            await first.stop(delete=True)
        assert not first.root.exists()
        second = environment(tmp_path, kind=SandboxEnvironment)
        await second.start(force_build=False)
        try:
            r = await second.exec(
                "cat /etc/tether-trial; ls /usr/local/share/tether; ls /usr/bin/env"
            )
            assert r.stdout == "/usr/bin/env\n", r.stdout
        finally:
            await second.stop(delete=True)

    asyncio.run(scenario())
    assert not Path("/etc/tether-trial").exists() and Path("/usr/bin/env").exists()


@needs_bwrap
def test_a_dockerfile_is_built_once_with_the_network_and_each_trial_starts_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Dockerfile's RUN fetches over the network (a server on this machine's loopback
    stands for a package registry) and records when it ran; two trials of the task see the
    same build (built once, kept), neither has the network the build had; a RUN that fails
    fails the trial at start naming the instruction, and nothing half-built is kept."""
    import http.server
    import threading

    from tether.harbor.build import images

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "package.txt").write_text("fetched at build\n")
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "served")
    )
    registry = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=registry.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{registry.server_address[1]}/package.txt"
    fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
    (tmp_path / "environment").mkdir()
    dockerfile = tmp_path / "environment" / "Dockerfile"
    dockerfile.write_text(
        f"FROM debian:12\nRUN {fetch} > /srv/package.txt\nRUN date +%s%N > /built-at\n"
    )

    async def trial() -> str:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            r = await env.exec(f"cat /srv/package.txt /built-at; {fetch} || echo no network")
            return r.stdout or ""
        finally:
            await env.stop(delete=True)

    try:
        first, second = asyncio.run(trial()), asyncio.run(trial())
    finally:
        registry.shutdown()
    assert first.startswith("fetched at build\n\n") and first.endswith("no network\n"), first
    assert second == first  # the same build: its RUN ran once
    dockerfile.write_text("FROM debian:12\nRUN echo about to fail && exit 3\n")
    kept = sorted(images().iterdir())
    with pytest.raises(
        RuntimeError, match="line 2: RUN echo about to fail && exit 3: exit status 3"
    ):
        asyncio.run(trial())
    assert [p for p in sorted(images().iterdir()) if p not in kept and p.is_dir()] == []


@needs_bwrap
def test_a_trial_given_the_network_reaches_it_and_runs_a_task_that_asks_for_it(
    tmp_path: Path,
) -> None:
    """`--ek network=true`: a trial shares this machine's network (a server on its loopback
    answers), and a task that asks for the internet runs instead of being refused."""
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    (tmp_path / "hello.txt").write_text("hello over the network\n")
    local = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=local.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{local.server_address[1]}/hello.txt"
    fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read().decode())\""
    (tmp_path / "environment").mkdir()

    async def trial(**given: Any) -> str:
        env = environment(tmp_path, kind=SandboxEnvironment, **given)
        await env.start(force_build=False)
        try:
            return (await env.exec(f"{fetch} || echo no network")).stdout or ""
        finally:
            await env.stop(delete=True)

    try:
        assert asyncio.run(trial()).endswith("no network\n")
        assert asyncio.run(trial(network="true")).startswith("hello over the network")
    finally:
        local.shutdown()
    # through Harbor: the task that asks for the internet runs, and its oracle scores 1
    single = tmp_path / "tasks"
    single.mkdir()
    shutil.copytree(FLAWS / "internet", single / "internet")
    given = harbor_run(tmp_path / "jobs", "--agent", "oracle", "--ek", "network=true", tasks=single)
    assert rewards(given)["internet"] == 1.0


@needs_bwrap
def test_a_trials_sandbox_is_a_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from inside: the container's paths are real, the system is the trial's own copy
    (what it writes never reaches the host), there is no capability, no network and no
    secret of the host; a process left running is there for the next command and gone with
    the trial; a time-out kills the command, status 124."""
    monkeypatch.setenv("SECRET_TOKEN", "sk-host-secret")
    planted = Path.home() / f".tether-planted-{os.getpid()}"
    planted.write_text("planted secret\n")
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "setup.sh").write_text("echo set up > /app/ready.txt\n")

    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            r = await env.exec("cat ready.txt; pwd; echo 1 > /logs/verifier/reward.txt; env")
            assert r.return_code == 0, r.stderr
            assert (r.stdout or "").startswith("set up\n/app\n")
            assert "sk-host-secret" not in (r.stdout or "")
            assert env.local("/logs/verifier/reward.txt").read_text() == "1\n"
            # the system is the trial's copy: written inside, never on the host (asserted
            # at the end); as root too, no capability to mount the host's directories
            r = await env.exec("touch /etc/tether-was-here && ls /etc/tether-was-here")
            assert r.return_code == 0, r.stderr
            r = await env.exec("mkdir /mnt; mount --bind /proc /mnt; umount -l /usr; ls /usr")
            assert "mount: /mnt: permission denied" in (r.stderr or ""), r.stderr
            assert "umount: /usr: must be superuser" in (r.stderr or ""), r.stderr
            await env.exec("touch /var/tether-was-here")
            r = await env.exec("grep CapEff /proc/self/status; ls -a /run /var/run")
            effective = int((r.stdout or "").split()[1], 16)
            # root keeps a container's capabilities where users are mapped (Tether as root),
            # none otherwise; never CAP_SYS_ADMIN (21), which mounts
            allowed = sum(1 << c for c in CONTAINER_CAPABILITIES.values()) if env.users else 0
            assert effective & ~allowed == 0 and not effective & (1 << 21), r.stdout
            assert "postgresql" not in (r.stdout or "")  # no host socket directory
            r = await env.exec(f"cat {planted}; grep -c root: /etc/shadow; ls -a ~ /root /home")
            assert "planted secret" not in (r.stdout or "")  # no user's home
            assert "\n1\n" not in (r.stdout or "")  # no shadow
            with socket.socket() as listener:  # a server on the host's loopback
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                port = listener.getsockname()[1]
                r = await env.exec(f"echo hi > /dev/tcp/127.0.0.1/{port} && echo reached")
            assert r.return_code != 0 and "reached" not in (r.stdout or "")
            await env.exec("setsid nohup sleep 300 > /dev/null 2>&1 &")
            # still there for the next command, as in a container (once it has become
            # `sleep`: under load the background exec may not be done when `exec` returns)
            await until(lambda: host_sleepers(env), "the left-over sleep to start", 10)
            r = await env.exec("pgrep -x sleep")
            assert r.return_code == 0
            t0 = time.monotonic()
            r = await env.exec("sleep 30", timeout_sec=1)
            assert r.return_code == 124 and time.monotonic() - t0 < 10
        finally:
            await env.stop(delete=True)
        await until(lambda: not host_sleepers(env), "the trial's processes to end", 5)

    try:
        asyncio.run(scenario())
    finally:
        planted.unlink()
    assert not Path("/etc/tether-was-here").exists()
    assert not Path("/var/tether-was-here").exists()


@needs_bwrap
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_trials_sandbox_holds_for_root_and_for_an_ordinary_user(
    user: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes of bash's sandbox, run in a trial's (its root and namespaces, with the
    probe in place of its server), as root (its users mapped, as it runs) and as an ordinary
    user: no remount, no write to the host, no capability beyond a container's (none for the
    ordinary user), no host socket, nothing of a home, of /etc/shadow or of a store kept in a
    service's directory (/var/lib, /srv); the system's programs are there."""
    import shutil
    import tempfile

    from helpers import probe_sandbox
    from tether.harbor import sandbox as sandbox_module
    from tether.harbor.rootfs import remove

    if os.geteuid() != 0:
        pytest.skip("the root case and the switch to an ordinary user need root")
    folder = Path(tempfile.mkdtemp(prefix="tether-trial-"))  # reachable by an ordinary user
    folder.chmod(0o755)
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    assert system_python is not None
    # the root's first step runs on a Python that nobody may read too (this one lives in
    # root's home here)
    monkeypatch.setattr(sandbox_module, "interpreter", lambda: system_python)
    env = environment(folder, kind=SandboxEnvironment)
    assert isinstance(env, SandboxEnvironment)
    try:
        env.make_places()
        if user == "nobody":  # the trial's layers are its user's, as they are when it makes them
            subprocess.run(["chown", "-R", "65534:65534", str(env.root)], check=True)
        env.root.chmod(0o755)  # the trial's scratch, 0700 by default: the other user's here

        def trial(probe: str) -> list[str]:
            return env.argv(["/bin/bash", "-c", probe])

        def mapped(probe: str) -> tuple[str, str]:
            """As root, the trial as it runs: its users mapped, root with a container's
            capabilities."""

            async def launched() -> tuple[bytes, bytes]:
                process = await env.launch(["/bin/bash", "-c", probe])
                return await process.communicate()

            out, err = asyncio.run(launched())
            return out.decode(), err.decode()

        if user == "root":
            allowed = sum(1 << c for c in CONTAINER_CAPABILITIES.values())
            said = probe_sandbox(trial, user, run=mapped, allowed_caps=allowed)
        else:
            said = probe_sandbox(trial, user)
    finally:
        shutil.rmtree(folder)
        remove(env.root)
    assert "ESCAPED" not in said, said


@needs_bwrap
def test_a_command_that_prints_10_mb_returns_its_head_and_tail(tmp_path: Path) -> None:
    """A reply over asyncio's 64 KiB line limit killed the reader and hung every later exec;
    now each stream comes back as its head and tail, and the next command runs."""
    (tmp_path / "environment").mkdir()

    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            big = "echo FIRST; head -c 10000000 /dev/zero | tr '\\0' x; echo; echo LAST"
            r = await asyncio.wait_for(env.exec(big), 60)
            out = r.stdout or ""
            assert r.return_code == 0 and out.startswith("FIRST\n") and out.endswith("LAST\n")
            assert "bytes of output cut" in out and len(out) < 2_000_000
            r = await asyncio.wait_for(env.exec("echo next"), 30)
            assert r.stdout == "next\n"
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())


def host_sleepers(env: LocalEnvironment) -> list[int]:
    """The host's pids of the trial's `sleep 300` (found by the sandbox's own mount)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes() == b"sleep\x00300\x00":
                root = os.readlink(proc / "cwd")
                if root == "/app" or str(env.root) in root:
                    found.append(int(proc.name))
        except OSError:
            continue
    return found


@needs_bwrap
def test_a_cancelled_exec_kills_its_command_in_the_sandbox(tmp_path: Path) -> None:
    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            call = asyncio.ensure_future(env.exec("echo $$ > /app/pid; exec sleep 300"))
            await until(lambda: env.local("/app/pid").exists(), "the command to start")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            inner = env.local("/app/pid").read_text().strip()
            gone = f"for i in $(seq 50); do kill -0 {inner} || exit 0; sleep 0.1; done; exit 1"
            assert (await env.exec(gone)).return_code == 0  # the command's process is gone
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())


@needs_bwrap
def test_the_harbor_bash_keeps_a_shell_session_in_the_sandbox(tmp_path: Path) -> None:
    from tether.harbor import tools as harbor_tools
    from tether.tools.tool import RunContext

    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            ctx = RunContext(workspace=Path("/app"), deps=env)

            async def bash(command: str, fresh: bool = False) -> str:
                out, _ = await harbor_tools.bash.call({"command": command, "fresh": fresh}, ctx)
                return out

            assert await bash("mkdir -p w && cd w && export K=v") == "exit status 0\n"
            assert await bash("pwd; echo $K") == "exit status 0\n/app/w\nv\n"
            assert await bash("pwd; echo [$K]", fresh=True) == "exit status 0\n/app\n[]\n"
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())


def test_the_sandbox_server_runs_on_a_python_it_can_see(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox's /tmp is its own: a virtualenv copied into /tmp (a CI checkout's) is not
    there, so the server runs on the system's Python instead (seen failing in CI)."""
    from tether.harbor import sandbox as sandbox_module

    copied = tmp_path / "python3"
    copied.write_bytes(b"")
    monkeypatch.setattr(sys, "executable", str(copied))
    assert str(tmp_path).startswith("/tmp/")
    chosen = sandbox_module.interpreter()
    assert not os.path.realpath(chosen).startswith("/tmp/") and os.access(chosen, os.X_OK)
