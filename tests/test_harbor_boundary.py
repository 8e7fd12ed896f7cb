"""A Harbor trial's files are a boundary: no link made inside reaches a host file, on the way in
or out, and no setuid program comes out (as root, a trial's root keeps a container's
capabilities with the host's ids mapped to themselves)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from test_harbor import environment, needs_bwrap  # skips this module as it skips its own
from tether import RunContext, Toolbox, ToolCall
from tether.approvals import approve_all
from tether.harbor import tools as harbor_tools
from tether.harbor.environment import LocalEnvironment
from tether.harbor.sandbox import SandboxEnvironment


def special_files(top: Path) -> list[str]:
    """Files and directories under `top` with a setuid or setgid bit, or not this process's."""
    found = []
    for folder, dirs, files in os.walk(top):
        for name in [*dirs, *files]:
            info = os.lstat(Path(folder) / name)
            if info.st_mode & 0o6000 or info.st_uid != os.geteuid():
                found.append(f"{name} {oct(info.st_mode)} uid {info.st_uid}")
    return found


@pytest.fixture(params=["root", "ordinary-user"])
def trial_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """As Tether runs as root (the host's users mapped, root with a container's capabilities)
    and as an ordinary user's trial is made (only its own id, as root, no capability)."""
    if request.param == "ordinary-user" or os.geteuid() != 0:
        monkeypatch.setattr(SandboxEnvironment, "users", property(lambda self: False))
    return str(request.param)


@needs_bwrap
def test_a_trial_gets_no_host_file_in_or_out_through_its_links(
    tmp_path: Path, trial_kind: str
) -> None:
    """Links made inside to host paths (`ln -s /etc/shadow /app/x`, as the audit did): the
    model's read_file and write_file, Harbor's downloads of the logs and its upload of the
    tests reach only the trial's own files; downloads keep the links that stay inside them,
    and a setuid-root copy of bash comes out as the caller's plain file."""
    host = tmp_path / "host"
    host.mkdir()
    secret = host / "secret"
    secret.write_text("host secret\n")
    hostdir = host / "dir"
    hostdir.mkdir()
    (tmp_path / "environment").mkdir()
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            made = await env.exec(
                f"ln -s {secret} /app/x && ln -s {secret} /logs/verifier/secret"
                f" && ln -s {host} /logs/verifier/host && echo 1 > /logs/verifier/reward.txt"
                " && ln -s reward.txt /logs/verifier/alias && ln -s /etc/shadow /app/shadow"
                f" && rm -rf /tests && ln -s {hostdir} /tests"
                " && cp /bin/bash /logs/agent/rb && chmod 4755 /logs/agent/rb; echo made"
            )
            assert "made" in (made.stdout or ""), made.stderr
            ctx = RunContext(workspace=Path("/app"), deps=env)
            tools = Toolbox(harbor_tools.TOOLS)

            async def tool(name: str, **args: str) -> str:
                done = await tools.run(ToolCall("c", name, args), ctx, approve_all)
                return done.output

            for path in ("x", "shadow"):  # the trial's own: no file there, an empty shadow
                seen[f"read {path}"] = await tool("read_file", path=path)
            seen["write"] = await tool("write_file", path="x", content="overwritten")
            await env.download_dir("/logs/verifier", tmp_path / "verifier")
            await env.download_dir("/logs/agent", tmp_path / "agent")
            upload = tmp_path / "tests"
            upload.mkdir()
            (upload / "test.sh").write_text("exit 0\n")
            try:
                await env.upload_dir(upload, "/tests")
            except RuntimeError as e:  # /tests is a dangling link inside: refused, or not
                seen["upload"] = str(e)
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())
    for key in ("read x", "read shadow", "write"):
        assert "host secret" not in str(seen[key]), (key, seen[key])
        assert "root:" not in str(seen[key]), (key, seen[key])
    assert secret.read_text() == "host secret\n"
    assert list(hostdir.iterdir()) == []
    verifier = tmp_path / "verifier"
    assert (verifier / "reward.txt").read_text() == "1\n"
    assert (verifier / "alias").is_symlink() and (verifier / "alias").read_text() == "1\n"
    assert not (verifier / "secret").exists() and not (verifier / "secret").is_symlink()
    assert not (verifier / "host").exists() and not (verifier / "host").is_symlink()
    agent = tmp_path / "agent"
    assert (agent / "rb").is_file() and os.access(agent / "rb", os.X_OK)
    assert special_files(agent) == []


@needs_bwrap
def test_a_racing_process_cannot_swap_the_passage_for_a_link(
    tmp_path: Path, trial_kind: str
) -> None:
    """The passage files cross by is a directory of the trial's root, which root inside may
    replace: a process that keeps replacing every passage by a link to a host directory makes
    transfers fail or go to the trial's own files, never into or out of the host's."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret").write_text("host secret\n")
    (tmp_path / "environment").mkdir()
    upload = tmp_path / "upload.txt"
    upload.write_text("from the host\n")
    outcomes: list[str] = []

    async def scenario() -> None:
        env = environment(tmp_path, kind=SandboxEnvironment)
        await env.start(force_build=False)
        try:
            await env.exec("echo trial > /app/own.txt; echo trial > /usr/local/own.txt")
            swap = (
                "while true; do for d in /.tether-transfer-*; do [ -L $d ] || "
                f"{{ rm -rf $d; ln -s {host} $d; }}; done; done"
            )
            await env.exec(f"setsid nohup bash -c '{swap}' > /dev/null 2>&1 &")
            for i in range(30):
                try:
                    place = ("/app", "/usr/local")[i % 2]  # a place of the root, an overlay's
                    await env.upload_file(upload, f"{place}/up-{i}.txt")
                    await env.download_file(f"{place}/own.txt", tmp_path / f"down-{i}.txt")
                    outcomes.append("crossed")
                except (OSError, RuntimeError) as e:
                    outcomes.append(f"{type(e).__name__}: {e}")
        finally:
            await env.stop(delete=True)

    asyncio.run(scenario())
    assert sorted(p.name for p in host.iterdir()) == ["secret"], outcomes
    for down in tmp_path.glob("down-*.txt"):
        assert down.read_text() in ("trial\n", ""), down.read_text()
    assert len(outcomes) == 30


def test_a_dockerfile_copy_stays_in_its_build_context(tmp_path: Path) -> None:
    """`COPY ../x` and a link in the context that leads out of it read a host file into the
    trial (Docker refuses both); a link inside a copied directory goes as a link."""
    outside = tmp_path / "outside.txt"
    outside.write_text("host file\n")
    for name, copy in (("dots", "../outside.txt"), ("link", "leads-out")):
        task = tmp_path / name
        env_dir = task / "environment"
        env_dir.mkdir(parents=True)
        (env_dir / "leads-out").symlink_to(outside)
        (env_dir / "Dockerfile").write_text(f"FROM debian:12\nCOPY {copy} /app/\n")
        env = environment(task)
        with pytest.raises(RuntimeError, match="leads out of the build context"):
            asyncio.run(env.start(force_build=False))
        asyncio.run(env.stop(delete=True))
    task = tmp_path / "inside"
    env_dir = task / "environment"
    (env_dir / "data").mkdir(parents=True)
    (env_dir / "data" / "kept").write_text("kept\n")
    (env_dir / "data" / "link").symlink_to(outside)
    (env_dir / "Dockerfile").write_text("FROM debian:12\nCOPY data /app/data\n")
    env = environment(task)
    assert isinstance(env, LocalEnvironment)
    asyncio.run(env.start(force_build=False))
    try:
        assert (env.root / "app" / "data" / "kept").read_text() == "kept\n"
        assert (env.root / "app" / "data" / "link").is_symlink()
    finally:
        asyncio.run(env.stop(delete=True))
