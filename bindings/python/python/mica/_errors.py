"""The exceptions mica raises.

Every error is a :class:`MicaError`; the subclasses say what failed, so callers can catch
what they can handle. The native module raises them from the Rust library's typed errors
(never by parsing messages)."""

from __future__ import annotations

from typing import Optional


class MicaError(Exception):
    """Base class of every error mica raises."""


class ModelError(MicaError):
    """A model could not be opened or run: a missing, corrupt or unsupported file or folder."""


class ModelNotFound(MicaError, FileNotFoundError):
    """No such file, and no model of that name in the store or the catalog."""


class TokenizerError(MicaError):
    """Text could not be tokenized, or token ids could not be turned back into text."""


class ChatTemplateError(MicaError):
    """The model's chat template could not render the conversation."""


class InvalidParameter(MicaError, ValueError):
    """A parameter out of range; ``param`` names it (``"temperature"``, ``"top_p"``, ...)
    when it is a request parameter."""

    param: Optional[str] = None


class PromptTooLong(MicaError, ValueError):
    """The prompt does not fit in the context (with room for the completion)."""


class QueueFull(MicaError):
    """The engine's queue is full; retry later."""


class EngineError(MicaError):
    """The engine failed while running a request (or could not start)."""


class EngineStopped(EngineError):
    """The engine stopped before the request finished."""


class HubError(MicaError):
    """Pulling a model or reading the model store failed."""


class ConvertError(MicaError):
    """Converting or quantizing a model failed."""


class ServerError(MicaError):
    """The HTTP server could not start, or failed."""


__all__ = [
    "MicaError",
    "ModelError",
    "ModelNotFound",
    "TokenizerError",
    "ChatTemplateError",
    "InvalidParameter",
    "PromptTooLong",
    "QueueFull",
    "EngineError",
    "EngineStopped",
    "HubError",
    "ConvertError",
    "ServerError",
]
