"""Model clients. `make_model` builds one from CLI-style settings."""

from __future__ import annotations

import os

from ..errors import ConfigError, MissingAPIKey
from .base import Model, TextHook
from .http import HTTPSettings
from .openai_chat import OpenAIChatModel
from .scripted import ScriptedModel, reply

PROVIDERS = ("openai-chat", "openai-responses", "anthropic", "scripted")
DEFAULT_MODELS = {
    "openai-chat": "gpt-4.1-mini",
    "openai-responses": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-5",
    "scripted": "scripted",
}

__all__ = [
    "PROVIDERS",
    "HTTPSettings",
    "Model",
    "OpenAIChatModel",
    "ScriptedModel",
    "TextHook",
    "make_model",
    "reply",
]


def make_model(
    provider: str,
    model: str | None = None,
    *,
    base_url: str | None = None,
    stream: bool = True,
    settings: HTTPSettings | None = None,
    script: str | None = None,
) -> Model:
    """A model client for `provider`, reading its API key from the environment."""
    if provider == "scripted":
        if not script:
            raise ConfigError("the scripted provider needs --script FILE (a JSON list of replies)")
        return ScriptedModel.from_file(script)
    if provider == "openai-chat":
        key = os.environ.get("OPENAI_API_KEY")
        if not key:
            if base_url is None:
                raise MissingAPIKey("OPENAI_API_KEY", provider)
            key = "none"  # local compatible servers (Ollama, llama.cpp) take any key
        return OpenAIChatModel(
            model or DEFAULT_MODELS[provider],
            api_key=key,
            base_url=base_url or "https://api.openai.com/v1",
            stream=stream,
            settings=settings,
        )
    if provider in PROVIDERS:
        raise ConfigError(f"the {provider} provider is not available in this version yet")
    raise ConfigError(f"unknown provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
