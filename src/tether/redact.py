"""Keeping secrets out of transcripts, logs and error messages.

The secrets are the values of environment variables whose names say they are secrets
(`*_API_KEY`, `*_TOKEN`, `*_SECRET*`, `*PASSWORD*`), plus anything shaped like a provider key or
an Authorization header. Tool output is scrubbed before the model or the transcript sees it;
provider error messages before they are raised; every line Tether writes (JSON events, the
journal, the log) before it is written.
"""

from __future__ import annotations

import os
import re

MARK = "[redacted]"
SECRET_NAMES = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD)", re.I)
SHAPES = re.compile(
    r"(?:\bsk-[A-Za-z0-9_\-]{12,})"  # OpenAI and Anthropic keys
    r"|(?:(?<=Bearer )[A-Za-z0-9._\-~+/=]{12,})"  # Authorization: Bearer ...
    r"|(?:(?<=x-api-key: )\S{12,})",
    re.I,
)
MIN_LENGTH = 8  # shorter values would redact ordinary words


class Redactor:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        values = {v for k, v in env.items() if SECRET_NAMES.search(k) and len(v) >= MIN_LENGTH}
        self.values = sorted(values, key=len, reverse=True)
        self.encoded = [v.encode() for v in self.values]

    def add(self, value: str) -> None:
        if len(value) >= MIN_LENGTH and value not in self.values:
            self.values.append(value)
            self.values.sort(key=len, reverse=True)
            self.encoded = [v.encode() for v in self.values]

    def scrub(self, text: str) -> str:
        for v in self.values:
            if v in text:
                text = text.replace(v, MARK)
        if "sk-" in text or "Bearer " in text or "x-api-key" in text:
            text = SHAPES.sub(MARK, text)
        return text

    def scrub_bytes(self, line: bytes) -> bytes:
        """For serialized lines: cheap when there is nothing to find."""
        for v in self.encoded:
            if v in line:
                line = line.replace(v, MARK.encode())
        if b"sk-" in line or b"Bearer " in line or b"x-api-key" in line:
            line = SHAPES.sub(MARK, line.decode("utf-8", "replace")).encode()
        return line


_default: Redactor | None = None


def redactor() -> Redactor:
    """The process's redactor, made from the environment on first use."""
    global _default
    if _default is None:
        _default = Redactor()
    return _default


def scrub(text: str) -> str:
    return redactor().scrub(text)
