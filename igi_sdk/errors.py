"""Typed errors of the SDK.

Every failure a game developer can cause (a bad path, a prompt that does not fit, a bad sampling
value) raises a subclass of :class:`IgiError` with a message that says what to do about it. Each
error has a stable ``code`` (used on the wire by the sidecar protocol) and says whether retrying the
same request can succeed (``retryable``).
"""

from __future__ import annotations

import errno


class IgiError(Exception):
    """Base class of every error the SDK raises on purpose."""

    code = "internal"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- model files -------------------------------------------------------------------------------


class ModelError(IgiError):
    """The model file cannot be used."""

    code = "model_error"


class ModelFileNotFoundError(ModelError, FileNotFoundError):
    code = "model_not_found"


class NotAGGUFError(ModelError):
    code = "not_gguf"


class TruncatedModelError(ModelError):
    code = "truncated_model"


class UnsupportedArchitectureError(ModelError):
    code = "unsupported_architecture"


class ModelLoadError(ModelError):
    """llama.cpp refused to load the model (out of memory, missing tensors, ...)."""

    code = "model_load_failed"


class LoadCancelledError(ModelLoadError):
    """A placement being loaded was given up before it finished (the game needed the memory
    it was taking). Internal to a reshard; on the wire, as any refused load."""


class DraftMismatchError(ModelLoadError):
    """The draft model for speculative decoding has another vocabulary than the target: its
    token ids would mean other text. (On the wire: ``model_load_failed``, as any refused load.)"""


# --- plans / placement ---------------------------------------------------------------------------


class PlanError(IgiError):
    code = "invalid_plan"


class BudgetTooSmallError(PlanError):
    code = "budget_too_small"

    def __init__(self, message: str, minimum_bytes: int) -> None:
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


# --- sessions and generation ---------------------------------------------------------------------


class SessionError(IgiError):
    code = "session_error"


class UnknownSessionError(SessionError, KeyError):
    code = "unknown_session"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class SessionBusyError(SessionError):
    code = "session_busy"
    retryable = True


class TooManySessionsError(SessionError):
    code = "too_many_sessions"
    retryable = True


class PromptTooLongError(SessionError):
    code = "prompt_too_long"


class ContextFullError(SessionError):
    """Other sessions hold the shared context's cells this line needs (beyond the floor every
    session is guaranteed): the cells come back as their replies end or they close."""

    code = "context_full"
    retryable = True


class InvalidInputError(SessionError, ValueError):
    """tokenize/detokenize/embed input the loaded model cannot read: a token id outside its
    vocabulary, or a model that cannot embed (a reranker)."""

    code = "invalid_input"


class InvalidSamplingError(IgiError, ValueError):
    code = "invalid_sampling"


class InvalidGrammarError(IgiError, ValueError):
    code = "invalid_grammar"


class InvalidToolsError(InvalidGrammarError):
    """A chat's tools refused: a parameters schema past the JSON-schema limits, or one the
    grammar compiler refuses. The request's body is at fault, as with any bad field."""

    code = "invalid_body"


class UnknownToolCallError(InvalidToolsError):
    """A tool result naming a call that the reply it answers did not make (its id matches none
    of that reply's calls). Nothing was changed: the session is as before the request."""


class InvalidImageError(IgiError, ValueError):
    """Image bytes that are not a PNG/JPEG llama.cpp can decode, pixels whose size is zero,
    absurd or does not match the buffer, or images that do not match the line's media markers.
    Nothing was changed: the session is as before the request."""

    code = "invalid_image"


class VisionUnavailableError(IgiError):
    """A line with images for a model loaded without a vision projector (mmproj). Nothing was
    changed; load the model with its mmproj to send images."""

    code = "vision_unavailable"


class InvalidStateError(SessionError):
    """A session snapshot does not belong to this model or is damaged."""

    code = "invalid_state"


class SaveFailedError(SessionError):
    """A saved session could not be written or read (a read-only or failing disk, no
    permission, a name the file system refuses). A save that fails changes nothing on disk:
    an earlier save of that name is kept whole."""

    code = "save_failed"


class DiskFullError(SaveFailedError):
    """No space (or quota) left for a save; an earlier save of that name is kept whole. Free
    some space and save again."""

    code = "disk_full"
    retryable = True


_EDQUOT = getattr(errno, "EDQUOT", -1)


def save_io_error(e: OSError, label: str, doing: str = "save") -> SaveFailedError:
    """A typed error for an OS failure on save ``label``; it names the save, never a path."""
    reason = {
        errno.ENOSPC: "the disk is full",
        _EDQUOT: "the disk quota is used up",
        errno.EROFS: "the save directory is on a read-only file system",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENAMETOOLONG: "the name is too long for the file system",
        errno.EIO: "an I/O error (failing disk?)",
    }.get(e.errno or 0, e.strerror or type(e).__name__)
    kept = " (an earlier save of that name is unchanged)" if doing == "save" else ""
    cls = DiskFullError if e.errno in (errno.ENOSPC, _EDQUOT) else SaveFailedError
    return cls(f"could not {doing} the session save '{label}': {reason}{kept}")


class GenerationCancelled(IgiError):
    code = "cancelled"


class EngineClosedError(IgiError):
    code = "engine_closed"


class EngineUnavailableError(IgiError):
    """No placement of the model could be loaded (the GPU and host memory are taken); the
    sessions are kept and the sidecar keeps trying to load the model again."""

    code = "engine_unavailable"
    retryable = True


class UpstreamUnavailableError(IgiError):
    """The OpenAI-compatible upstream (``serve --upstream``) could not be reached, kept answering
    429/503 after every retry, or broke off a reply; the line is rolled back and the session
    keeps its conversation."""

    code = "upstream_unavailable"
    retryable = True


class UpstreamRefusedError(IgiError):
    """The upstream refused the request itself (a 4xx other than 429: a model name it does not
    serve, a body it cannot take); retrying the same line will not help."""

    code = "upstream_refused"


# --- VRAM reservations ---------------------------------------------------------------------------


class CannotFreeError(IgiError):
    """The model holds less VRAM than the game asked for: what is missing is held by others."""

    code = "cannot_free"


class DeadlineMissedError(IgiError):
    """The VRAM a game reserved was not free in time."""

    code = "deadline_missed"
    retryable = True


class InferenceError(IgiError):
    """llama.cpp failed while decoding (the session's state is kept)."""

    code = "inference_failed"
    retryable = True


class UsageError(IgiError):
    """A command line or option the SDK cannot act on (a bad size, an unknown name)."""

    code = "invalid_argument"


def coded_error(code: str, message: str, *, retryable: bool = False) -> IgiError:
    """An :class:`IgiError` carrying a wire error's code (a refusal read back from the
    protocol keeps its own code, not "internal")."""
    err = IgiError(message)
    err.code, err.retryable = code, retryable
    return err
