"""OpenAI's request bodies (the fields this server reads), their checks, and its error format.

Requests are pydantic models in strict mode: a field of the wrong type (a string for a number, a
bool for an integer) is a 400 naming the field, as are values out of OpenAI's ranges. Fields this
server does not know are ignored, as OpenAI's own clients send some (``user``, ``metadata``).
Options it knows but cannot honour (``n`` > 1, ``echo``, ``logprobs``, ``suffix``, ``best_of`` > 1,
tools) are a 400 that says so, rather than a silently different answer. Errors are
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status, as OpenAI sends them.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class ApiError(Exception):
    """An error answered in OpenAI's format with its HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    """The sampling fields both endpoints share."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str
    max_tokens: Optional[Annotated[int, Field(ge=1)]] = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Probability = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: Union[str, list[str], None] = None
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    seed: Optional[int] = None
    logit_bias: Optional[dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]] = None
    logprobs: Union[bool, int, None] = None
    user: Optional[str] = None

    def unsupported(self) -> list:
        """(param, why) of every option asked for that this server does not implement."""
        out = []
        if self.n != 1:
            out.append(("n", "n > 1 is not supported; send one request per completion"))
        if self.logprobs not in (None, False):
            out.append(("logprobs", "logprobs are not supported"))
        return out


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[Annotated[int, Field(ge=1)]] = None

    def unsupported(self) -> list:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo is not supported"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        if self.best_of not in (None, 1):
            out.append(("best_of", "best_of > 1 is not supported"))
        return out


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Optional[Annotated[int, Field(ge=1)]] = None
    tools: Optional[list] = None
    response_format: Optional[dict] = None

    def unsupported(self) -> list:
        out = super().unsupported()
        if self.tools:
            out.append(("tools", "tools (function calling) are not supported"))
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            out.append(("response_format", "only the text response format is supported"))
        return out


def validation_message(errors: list) -> tuple:
    """(message, param) of pydantic's first error, in words a client can act on."""
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = [str(p) for p in e.get("loc", ()) if p != "body"]
    # Union members add their type names to the location; keep the field path only.
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "list", "float", "bool")]
    param = ".".join(loc) or None
    kind = e.get("type", "")
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {e.get('msg', '')}", None
    if kind == "missing":
        return f"'{param}' is required", param
    if kind == "model_attributes_type":
        return "the request body must be a JSON object", None
    return f"'{param}': {e.get('msg', 'invalid value')}" if param else e.get("msg", "invalid request"), param
