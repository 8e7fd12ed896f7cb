"""What Tether's Harbor environments take from a task's Dockerfile: `ENV`, `ARG`, `WORKDIR`
and `COPY`/`ADD` are honoured, what cannot be is named (at start, as the trial's error), and
the rest is listed as not run. The `harbor run` of a whole task is in test_harbor.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tether.harbor.dockerfile import DockerfileError, read

try:
    from harbor.models.task.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from tether.harbor.environment import LocalEnvironment
except ImportError as e:  # the harbor extra is not installed
    if os.environ.get("TETHER_REQUIRE_HARBOR"):
        raise
    pytest.skip(f"harbor is not installed: {e}", allow_module_level=True)


def dockerfile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "environment" / "Dockerfile"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_env_arg_workdir_and_copy_are_read_as_docker_reads_them(tmp_path: Path) -> None:
    image = read(
        dockerfile(
            tmp_path,
            "# a comment\n"
            "FROM python:3.12-slim\n"
            "ARG WHO=world\n"
            'ENV GREETING="hello ${WHO}" \\\n'
            "    # a comment inside a continued line\n"
            "    PLAIN=1 EMPTY=${NOT_SET:-fallback}\n"
            "ENV OLD_FORM a value with spaces\n"
            "WORKDIR /srv\n"
            "WORKDIR task\n"
            "COPY --chown=1000 a.txt b.txt ./\n"
            'ADD ["dir", "/app/dir"]\n'
            "RUN pip install \\\n    requests\n"
            "USER nobody\n"
            'SHELL ["/bin/bash", "-c"]\n'
            'RUN ["echo", "exec form"]\n'
            "RUN echo $WHO > /tmp/who\n"
            'CMD ["serve"]\n',
        )
    )
    assert image.env == {
        "GREETING": "hello world",
        "PLAIN": "1",
        "EMPTY": "fallback",
        "OLD_FORM": "a value with spaces",
    }
    assert image.workdir == "/srv/task"
    assert [(c.sources, c.destination) for c in image.copies] == [
        (["a.txt", "b.txt"], "/srv/task/"),
        (["dir"], "/app/dir"),
    ]
    # each RUN with the environment (build arguments too), directory, user and shell it has
    # where it stands; the base named; what is never run listed
    first, exec_form, shell_form = image.runs
    assert first.argv == ["/bin/sh", "-c", "pip install requests"] and first.user is None
    assert first.env["WHO"] == "world" and first.workdir == "/srv/task" and first.line == 12
    assert exec_form.argv == ["echo", "exec form"] and exec_form.user == "nobody"
    assert shell_form.argv == ["/bin/bash", "-c", "echo $WHO > /tmp/who"]
    assert image.user == "nobody" and image.base == "python:3.12-slim"
    assert [type(s).__name__ for s in image.steps] == ["Copy", "Copy", "Run", "Run", "Run"]
    assert image.ignored == ['line 18: CMD ["serve"] (Harbor runs none)']


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("FROM a AS build\nFROM b\nCOPY --from=c:1 /x /app\n", "another image \\(c:1\\)"),
        ("FROM a\nCOPY --from=build /out /app\n", "line 2: COPY --from=build /out /app"),
        ("FROM a\nENTRYPOINT [not json\n", "line 2: ENTRYPOINT \\[not json: Expecting value"),
        ("FROM a\nADD https://example.com/x.tgz /app/\n", "ADD of a URL"),
        ("FROM a\nCOPY only-one\n", "a source and a destination are needed"),
    ],
)
def test_what_cannot_be_honoured_is_named(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(DockerfileError, match=named):
        read(dockerfile(tmp_path, text))


def environment(tmp_path: Path) -> LocalEnvironment:
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    return LocalEnvironment(
        environment_dir=tmp_path / "environment",
        environment_name="t",
        session_id="t__x__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(),
    )


def test_a_trial_starts_with_the_dockerfile_s_files_env_and_workdir(tmp_path: Path) -> None:
    dockerfile(tmp_path, "FROM a\nENV DATA=/work/data\nWORKDIR /work\nCOPY src/ data/\n")
    (tmp_path / "environment" / "src").mkdir()
    (tmp_path / "environment" / "src" / "x.txt").write_text("x\n")
    env = environment(tmp_path)

    async def scenario() -> str:
        await env.start(force_build=False)
        try:
            done = await env.exec('pwd; cat "$DATA/x.txt"; ls')
            return done.stdout or ""
        finally:
            await env.stop(delete=True)

    # the workdir is the trial's own place (here on the host), DATA's path mapped into it
    assert asyncio.run(scenario()).splitlines() == [str(env.root / "app"), "x", "data"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("FROM a\nCOPY tool /usr/local/bin/tool\n", "COPY tool /usr/local/bin/tool: this"),
        ("FROM a\nCOPY missing.txt /app/\n", "missing.txt is not in the build context"),
        ("FROM a AS s\nFROM b\nCOPY --from=s /x /app/x\n", "built in the sandbox only"),
    ],
)
def test_a_trial_whose_dockerfile_cannot_be_honoured_fails_at_start_naming_it(
    tmp_path: Path, text: str, named: str
) -> None:
    dockerfile(tmp_path, text)
    (tmp_path / "environment" / "tool").write_text("#!/bin/sh\n")
    env = environment(tmp_path)
    with pytest.raises(RuntimeError, match=named):
        asyncio.run(env.start(force_build=False))
    env_root = env.root
    asyncio.run(env.stop(delete=True))
    assert not env_root.exists()
