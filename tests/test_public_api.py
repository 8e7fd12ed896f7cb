"""The public API is what `tether.__all__` lists: every name there exists, and nothing is lost."""

from __future__ import annotations

from pathlib import Path

import tether

EXPECTED = {
    "BUILTINS",
    "AccountOverBudget",
    "Limits",
    "Standing",
    "Rate",
    "RateStanding",
    "Agent",
    "AnthropicModel",
    "OpenAIResponsesModel",
    "Budget",
    "ApprovalError",
    "ChildRunEnded",
    "ConfigError",
    "Event",
    "FallbackModel",
    "Guardrail",
    "HTTPSettings",
    "Message",
    "MissingAPIKey",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "OpenAIChatModel",
    "OutputInvalid",
    "Price",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderProtocolError",
    "ProviderStatusError",
    "ProviderTimeout",
    "RateLimited",
    "ReasoningPart",
    "RestartPolicy",
    "RunContext",
    "RunHandle",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "ServerError",
    "StoreUnavailable",
    "TetherError",
    "TextPart",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolSpec",
    "Toolbox",
    "Usage",
    "approve_all",
    "deny_all",
    "make_model",
    "reply",
    "run_child",
    "tool",
    "ImagePart",
    "ImagesUnsupported",
    "ClientRequestError",
    "NoSuchRun",
    "QuestionError",
    "RecordError",
    "ReplayDiverged",
    "RunEnded",
    "RunError",
    "RunExists",
}


def test_all_is_the_public_api() -> None:
    assert set(tether.__all__) == EXPECTED
    assert len(tether.__all__) == len(EXPECTED)


def test_every_public_name_exists() -> None:
    for name in tether.__all__:
        assert getattr(tether, name) is not None, name


def test_provider_errors_form_one_tree() -> None:
    for name in (
        "ProviderConnectionError",
        "ProviderTimeout",
        "ProviderStatusError",
        "RateLimited",
        "ServerError",
        "ProviderProtocolError",
        "ImagesUnsupported",
    ):
        assert issubclass(getattr(tether, name), tether.ProviderError)
    assert issubclass(tether.ProviderError, tether.TetherError)
    assert issubclass(tether.MissingAPIKey, tether.ConfigError)
    assert issubclass(tether.StoreUnavailable, tether.TetherError)


def test_the_readmes_python_quickstart_passes_mypy_strict(tmp_path: Path) -> None:
    """A newcomer's type checker on the README's own example: `run.wait()` was `RunResult |
    None`, so `result.outcome` failed `mypy --strict` as written."""
    import re
    import subprocess
    import sys

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Quickstart: Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    (tmp_path / "quickstart.py").write_text(code.group(1))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "quickstart.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_error_tree_drawn_in_errors_is_the_classes_tree() -> None:
    """`errors.py` draws every error a caller can catch in one tree: each class is drawn, under
    the class it derives from (a new error, or one moved, cannot be left out of the drawing)."""
    import re

    from tether import errors

    drawn: dict[str, str] = {}
    parents: list[tuple[int, str]] = [(-1, "TetherError")]
    for line in (errors.__doc__ or "").splitlines():
        found = re.match(r"^([\s│]*)[├└]── (\w+)", line)
        if found is None:
            continue
        depth, name = len(found.group(1)), found.group(2)
        while parents[-1][0] >= depth:
            parents.pop()
        drawn[name] = parents[-1][1]
        parents.append((depth, name))
    classes = {
        name: cls
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, errors.TetherError)
    }
    assert set(drawn) == set(classes) - {"TetherError"}
    for name, parent in drawn.items():
        assert classes[name].__bases__[0].__name__ == parent, name
