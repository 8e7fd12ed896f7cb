"""What a trial's copy-on-write root costs its start: a Harbor trial's environment started, one
`true` run in it, and stopped (its directory removed), for the sandbox as it is, the sandbox
with the read-only mounts it had before its own root (rebuilt here, for the comparison), the
sandbox starting from a built image (a Dockerfile with a `RUN`, built before the first timed
trial and kept), and the local environment (no sandbox); interleaved, with the median of
each.

    .venv/bin/python bench/harbor_start.py --trials 30
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # importing harbor must not fetch

from harbor.models.task.config import EnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from tether.harbor import rootfs
from tether.harbor.environment import LocalEnvironment
from tether.harbor.sandbox import SandboxEnvironment, interpreter
from tether.harbor.server import SERVER
from tether.tools.sandbox import bwrap, hardening, system_view


class ReadOnlySandbox(SandboxEnvironment):
    """The sandbox before its own root: the host's directories mounted read-only, the places
    bound from the trial's directory, /tmp and the homes empty tmpfs."""

    @property
    def users(self) -> bool:
        return False  # it mapped one user

    def argv(
        self, command: list[str] | None = None, waits: tuple[int, int] | None = None
    ) -> list[str]:
        argv = [bwrap(), "--unshare-all", "--die-with-parent", "--new-session", *system_view()]
        argv += [a for p in rootfs.SHOWN if os.path.isdir(p) for a in ("--ro-bind", p, p)]
        argv += [a for p in rootfs.SERVICE_STATE if os.path.isdir(p) for a in ("--tmpfs", p)]
        argv += [a for p in rootfs.PACKAGE_STATE if os.path.isdir(p) for a in ("--ro-bind", p, p)]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", *hardening()]
        argv += [a for h in rootfs.HOMES if os.path.isdir(h) for a in ("--tmpfs", h)]
        python = interpreter()
        prefix = os.path.realpath(sys.base_prefix)
        if python.startswith(prefix + "/"):
            argv += ["--ro-bind", prefix, prefix]
        for place in ("app", "logs", "tests", "solution"):
            argv += ["--bind", str(self.rootfs.fs / place), f"/{place}"]
        return [*argv, "--chdir", "/app", "--", python, "-I", "-c", SERVER]


IMAGE = "FROM debian:12\nRUN useradd --create-home player && echo built > /srv/built\n"


async def trial(kind: type[LocalEnvironment], folder: Path, task: str) -> float:
    paths = TrialPaths(Path(tempfile.mkdtemp(dir=folder)))
    paths.mkdir()
    started = time.perf_counter()
    env = kind(
        environment_dir=folder / task,
        environment_name="t",
        session_id="t__x__env",
        trial_paths=paths,
        task_env_config=EnvironmentConfig(),
    )
    await env.start(force_build=False)
    done = await env.exec("true")
    await env.stop(delete=True)
    assert done.return_code == 0, done.stderr
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    kinds: dict[str, tuple[type[LocalEnvironment], str]] = {
        "local (no sandbox)": (LocalEnvironment, "plain"),
        "sandbox, read-only mounts": (ReadOnlySandbox, "plain"),
        "sandbox, copy-on-write root": (SandboxEnvironment, "plain"),
        "sandbox, from a built image": (SandboxEnvironment, "image"),
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as folder:
        os.environ["XDG_CACHE_HOME"] = f"{folder}/cache"
        (Path(folder) / "plain").mkdir()
        (Path(folder) / "image").mkdir()
        (Path(folder) / "image" / "Dockerfile").write_text(IMAGE)
        first_build = await trial(SandboxEnvironment, Path(folder), "image")
        for _ in range(args.trials):
            for name, (kind, task) in kinds.items():
                times[name].append(await trial(kind, Path(folder), task))
    print(f"start, `true`, stop: {args.trials} trials each, interleaved, median wall time")
    base = statistics.median(times["local (no sandbox)"]) * 1000
    for name, ts in times.items():
        t = statistics.median(ts) * 1000
        print(f"  {name:30} {t:6.1f} ms   (+{t - base:.1f} ms)")
    print(f"  (the image's build, with the first trial: {first_build * 1000:.0f} ms)")


if __name__ == "__main__":
    asyncio.run(main())
