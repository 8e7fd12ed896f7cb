"""Keeping secrets out of transcripts, logs and error messages.

The secrets are the values of environment variables whose names say they are secrets
(`*_API_KEY`, `*_TOKEN`, `*_SECRET*`, `*PASSWORD*`, `*_PAT`, `*CREDENTIAL*`), as they are and as
JSON writes them, plus anything shaped like one: a provider key, an Authorization header, a
GitHub token, an AWS access key id, the password in a URL (`postgresql://app:PW@db/x`). Tool
output is scrubbed before the model or the transcript sees it; provider error messages before
they are raised; every line Tether writes (JSON events, the journal, the log) before it is
written.

What it cannot do is find a secret that was transformed (`base64`, `rev`, half of it): that is
why the bash tool's environment holds no secrets at all (see `tools/bash.py`).
"""

from __future__ import annotations

import os
import re

import orjson

MARK = "[redacted]"
SECRET_NAMES = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|_PAT$|^PAT$|CREDENTIAL)", re.I)
SHAPES = re.compile(
    r"(?:\bsk-[A-Za-z0-9_\-]{12,})"  # OpenAI and Anthropic keys
    r"|(?:(?<=Bearer )[A-Za-z0-9._\-~+/=]{12,})"  # Authorization: Bearer ...
    r"|(?:(?<=x-api-key: )\S{12,})"
    r"|(?:\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}))"  # GitHub tokens
    r"|(?:\bAKIA[0-9A-Z]{16}\b)",  # AWS access key ids
    re.I,
)
URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^\s:/@\"'\\]*:)([^\s@/\"'\\]+)(@)", re.I)
HINTS = (
    "sk-",
    "Bearer ",
    "x-api-key",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "AKIA",
)
"""Substrings without which no shape can match: most text is scrubbed by a few `in` tests.
Looked for in the text lowered, as the shapes match in any case (`authorization: bearer ...`
was left whole while the hints were looked for as written)."""
HINTS_LOWER = tuple(h.lower() for h in HINTS)
HINT_BYTES = (b"://", *(h.encode() for h in HINTS_LOWER))
HINTED = re.compile("|".join(map(re.escape, HINTS_LOWER)))
"""Any hint, in lowered text: one search where a loop over the hints took 0.7 µs a text."""
HINTED_BYTES = re.compile(b"|".join(map(re.escape, HINT_BYTES)))
MIN_LENGTH = 8  # shorter values would redact ordinary words


def forms(value: str) -> list[str]:
    """A secret as it is and as a JSON string holds it (quotes, backslashes, `\\/` escaped)."""
    quoted = orjson.dumps(value).decode()[1:-1]
    return [value] if quoted == value else [value, quoted, quoted.replace("/", "\\/")]


class Redactor:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.values: list[str] = []
        self.encoded: list[bytes] = []
        for k, v in env.items():
            if SECRET_NAMES.search(k):
                self.add(v)

    def add(self, value: str) -> None:
        if len(value) < MIN_LENGTH:
            return
        for form in forms(value):
            if form not in self.values:
                self.values.append(form)
        self.values.sort(key=len, reverse=True)
        self.encoded = [v.encode() for v in self.values]

    def scrub(self, text: str) -> str:
        for v in self.values:
            if v in text:
                text = text.replace(v, MARK)
        if HINTED.search(text.lower()):
            text = SHAPES.sub(MARK, text)
        if "://" in text:
            text = URL_PASSWORD.sub(rf"\1{MARK}\3", text)
        return text

    def scrub_bytes(self, line: bytes) -> bytes:
        """For serialized lines: cheap when there is nothing to find."""
        for v in self.encoded:
            if v in line:
                line = line.replace(v, MARK.encode())
        if HINTED_BYTES.search(line.lower()):
            line = self.scrub(line.decode("utf-8", "replace")).encode()
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
