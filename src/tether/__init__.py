"""Tether: a supervised runtime for LLM agents."""

from __future__ import annotations

from .accounts import Limits, Standing
from .agent import Agent
from .approvals import approve_all, deny_all
from .backends import RunHandle
from .children import run_child
from .errors import (
    AccountOverBudget,
    ApprovalError,
    ChildRunEnded,
    ClientRequestError,
    ConfigError,
    ImagesUnsupported,
    MissingAPIKey,
    NoSuchRun,
    OutputInvalid,
    ProviderConnectionError,
    ProviderError,
    ProviderProtocolError,
    ProviderStatusError,
    ProviderTimeout,
    QuestionError,
    RateLimited,
    RecordError,
    ReplayDiverged,
    RunEnded,
    RunError,
    RunExists,
    ServerError,
    StoreUnavailable,
    TetherError,
)
from .events import Event
from .guardrails import Guardrail
from .loop import Budget
from .messages import (
    ImagePart,
    Message,
    ModelRequest,
    ModelResponse,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
)
from .pricing import Price
from .providers import (
    AnthropicModel,
    FallbackModel,
    HTTPSettings,
    Model,
    OpenAIChatModel,
    OpenAIResponsesModel,
    ScriptedModel,
    make_model,
    reply,
)
from .rates import Rate, RateStanding
from .result import RunResult
from .run import RestartPolicy
from .runtime import Runtime
from .tools import BUILTINS, RunContext, Tool, Toolbox, tool
from .version import __version__ as __version__

__all__ = [
    "BUILTINS",
    "AccountOverBudget",
    "Agent",
    "AnthropicModel",
    "ApprovalError",
    "Budget",
    "ChildRunEnded",
    "ClientRequestError",
    "ConfigError",
    "Event",
    "FallbackModel",
    "Guardrail",
    "HTTPSettings",
    "ImagePart",
    "ImagesUnsupported",
    "Limits",
    "Message",
    "MissingAPIKey",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "NoSuchRun",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "OutputInvalid",
    "Price",
    "ProviderConnectionError",
    "ProviderError",
    "ProviderProtocolError",
    "ProviderStatusError",
    "ProviderTimeout",
    "QuestionError",
    "Rate",
    "RateLimited",
    "RateStanding",
    "ReasoningPart",
    "RecordError",
    "ReplayDiverged",
    "RestartPolicy",
    "RunContext",
    "RunEnded",
    "RunError",
    "RunExists",
    "RunHandle",
    "RunResult",
    "Runtime",
    "ScriptedModel",
    "ServerError",
    "Standing",
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
]
