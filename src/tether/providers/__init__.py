"""Model clients. `make_model` builds one from CLI-style settings."""

from __future__ import annotations

from ..errors import ConfigError
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
    """A model client for `provider`, reading its API key (and, without `base_url`, its URL)
    from the provider's usual environment variables."""
    if provider == "scripted":
        if not script:
            raise ConfigError("the scripted provider needs --script FILE (a JSON list of replies)")
        return ScriptedModel.from_file(script)
    if provider == "local":
        from .local import LocalModel

        return LocalModel(stream=stream, settings=settings)
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; choose one of {', '.join(PROVIDERS)}")
    name = model or DEFAULT_MODELS[provider]
    if provider == "anthropic":
        return AnthropicModel(name, base_url=base_url, stream=stream, settings=settings)
    cls = OpenAIChatModel if provider == "openai-chat" else OpenAIResponsesModel
    return cls(name, base_url=base_url, stream=stream, settings=settings)
