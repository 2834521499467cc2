"""The one error tree: raised inside Reef, translated once at each boundary."""

from __future__ import annotations


class ReefError(Exception):
    """Base of every error Reef raises on purpose.

    `status` and `type` are what the HTTP boundary sends (OpenAI-style error JSON);
    `code` is a short machine-readable reason, `param` the offending field if any.
    """

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param

    def public_message(self) -> str:
        """What the HTTP boundary tells the client: the message, unless the error's class
        says less (its message can name what a client must not see)."""
        return self.message


class ConfigError(ReefError):
    """Invalid settings or YAML: raised at start, never while serving."""

    code = "invalid_config"


class BadRequest(ReefError):
    status = 400
    type = "invalid_request_error"


class NothingToTrain(BadRequest):
    """A batch holds nothing a recipe can learn from (e.g. no score reaches the threshold and
    nothing was corrected, or a harness search changed nothing): a verdict on the data, not a
    failure to retry."""

    code = "nothing_to_train"


class Unauthorized(ReefError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ReefError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(ReefError):
    status = 404
    type = "not_found_error"
    code = "not_found"


class UnknownModel(NotFound):
    code = "model_not_found"


class Conflict(ReefError):
    status = 409
    type = "conflict_error"
    code = "conflict"


class IdempotencyKeyReused(Conflict):
    """An Idempotency-Key already names a record of the scenario (with another request
    body, when it reaches a client)."""

    code = "idempotency_key_reused"


class SessionTurnTaken(Conflict):
    """Another record (written by another replica, or by a concurrent call with the same
    explicit session id) holds this record's turn of its session; reef.serving re-stitches
    the record and writes it again, so this reaches no client."""

    code = "session_turn_taken"


class HeadMoved(Conflict):
    """A publisher's parent release is no longer its scenario's head: someone else published
    first, so what was gated against the old head must be gated again."""

    code = "head_moved"


class PayloadTooLarge(ReefError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(ReefError):
    """A JSON route was sent a body that does not say it is JSON (a browser's text/plain form
    post, say)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class MisdirectedRequest(ReefError):
    """The Host header names a server this one does not answer for (DNS rebinding)."""

    status = 421
    type = "invalid_request_error"
    code = "host_not_allowed"


class EngineError(ReefError):
    """The engine failed while serving an accepted request."""

    status = 500
    type = "server_error"
    code = "engine_error"


class EngineUnavailable(EngineError):
    status = 503
    code = "engine_unavailable"


class RateLimited(ReefError):
    """A token's quota is spent for now (auth.tokens[].quota): OpenAI's 429, with how long
    until the window that is full ends (the HTTP boundary sends it as Retry-After). `type` is
    the count at its limit, "requests" or "tokens", as OpenAI's own 429s say."""

    status = 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int, type: str, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s
        self.type = type


class EngineBusy(RateLimited):
    """The engine's line is full, or a call waited in it too long (reef.admission): 429 with
    Retry-After, in OpenAI's error shape (Anthropic's on /v1/messages). Safe to retry: the call
    was never run."""

    def __init__(self, message: str, *, retry_after_s: int, reason: str):
        super().__init__(
            message, retry_after_s=retry_after_s, type="rate_limit_error", code="engine_busy"
        )
        self.reason = reason  # queue_full | queue_wait


class ServiceUnavailable(ReefError):
    """Something this request needs is not running here (a worker, say)."""

    status = 503
    type = "server_error"
    code = "unavailable"


class UpstreamError(EngineError):
    """The upstream server failed (5xx) or could not be reached."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"


class UpstreamRejected(ReefError):
    """The upstream refused the request (4xx): relayed with its status and message."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, message: str, *, status: int, code: str | None = None):
        super().__init__(message, code=code)
        self.status = status


class StoreError(ReefError):
    """The database (or, as ArtifactStoreError, the artifact store) failed. The message is the
    driver's, which names the database's host, port, user and name: it goes to the server's
    log, and the client is told only which store failed and when to retry."""

    status = 503
    type = "server_error"
    code = "store_unavailable"
    # Sent as Retry-After: a database that refused a write is often back within seconds (a
    # restart, a failover), and the OpenAI and Anthropic SDKs retry a 503 after it.
    retry_after_s = 2
    store = "record store"

    def public_message(self) -> str:
        return f"the {self.store} is unavailable; retry after {self.retry_after_s} s"


class StoreTimeout(StoreError):
    """The database did not answer within the serving path's deadline (store.deadline_s): a
    server that accepts connections and then never answers (its processes stopped, so its
    kernel still acknowledges data and keepalives, and libpq's tcp_user_timeout never fires).
    The connection that waited was closed on the client's side (reef.store.deadline)."""

    def __init__(self, message: str, *, seconds: float):
        super().__init__(message)
        self.seconds = seconds

    def public_message(self) -> str:
        return (
            f"the {self.store} (the database) did not answer within {self.seconds:g} s; "
            f"retry after {self.retry_after_s} s"
        )


class ArtifactStoreError(StoreError):
    """The artifact store (a directory or an S3 bucket) failed."""

    store = "artifact store"
