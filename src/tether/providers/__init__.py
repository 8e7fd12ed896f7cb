"""Model clients. `make_model` builds one from CLI-style settings."""

from __future__ import annotations

import os

from ..errors import ConfigError, MissingAPIKey
from .anthropic import AnthropicModel
from .base import Model, TextHook
from .fallback import FallbackModel
from .http import HTTPSettings
from .openai_chat import OpenAIChatModel
from .openai_responses import OpenAIResponsesModel
from .scripted import ScriptedModel, reply

PROVIDERS = ("openai-chat", "openai-responses", "anthropic", "local", "scripted")
DEFAULT_MODELS = {
    "openai-chat": "gpt-4.1-mini",
    "openai-responses": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-5",
    "scripted": "scripted",
    "local": "smollm2-135m-instruct",
}

__all__ = [
    "PROVIDERS",
    "AnthropicModel",
    "FallbackModel",
    "HTTPSettings",
    "Model",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
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
    if provider == "local":
        from .local import LocalModel

        return LocalModel(stream=stream, settings=settings)
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
    variable = "ANTHROPIC_API_KEY" if provider == "anthropic" else "OPENAI_API_KEY"
    key = os.environ.get(variable)
    if not key:
        if base_url is None:
            raise MissingAPIKey(variable, provider)
        key = "none"  # local compatible servers (Ollama, llama.cpp) take any key
    name = model or DEFAULT_MODELS[provider]
    if provider == "anthropic":
        return AnthropicModel(
            name,
            api_key=key,
            base_url=base_url or "https://api.anthropic.com",
            stream=stream,
            settings=settings,
        )
    cls = OpenAIChatModel if provider == "openai-chat" else OpenAIResponsesModel
    return cls(
        name,
        api_key=key,
        base_url=base_url or "https://api.openai.com/v1",
        stream=stream,
        settings=settings,
    )
