"""What the preprocessing library and the engine take as a prompt: a chat (messages, tools,
template variables), or a raw prompt (text or token ids) with the images and videos its markers stand for.
Plain records: protobuf's PromptInput (protos/tessera.proto, the same fields) stays at the
servicers, which convert it once (prompt_wire.py), and in the gateway's wire code.
prompt_input.py checks what these types cannot say (a prompt is set, roles and content agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from services.models.video import VideoOptions
from services.preprocess.truncation import Truncation


class Role(StrEnum):
    SYSTEM = "system"
    DEVELOPER = "developer"  # OpenAI's newer name for system, rendered as system
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image: its encoded bytes, or a reference (a data: URL, http(s), file:// or an
    absolute path, bare base64), or neither with a ``uuid`` alone; a ``uuid`` is an alias bound to
    the bytes first sent with it (media_uuids.py)."""

    data: bytes | None = None
    url: str | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class VideoInput:
    """One video clip: its encoded bytes, or a reference (a data: URL, http(s), file:// or an
    absolute path), or neither with a ``uuid`` alone, bound as an image's is (media_uuids.py)."""

    data: bytes | None = None
    url: str | None = None
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class ContentPart:
    text: str | None = None
    image: ImageInput | None = None  # user messages only
    video: VideoInput | None = None  # user messages only


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str  # the function called
    arguments: str  # its arguments, as the JSON text the model wrote


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """``role`` None: a role the sender gave that is none of ours. ``text`` and ``parts`` are
    distinct (templates render a string and a list of parts differently); neither: no content,
    allowed for an assistant turn only."""

    role: Role | None
    text: str | None = None
    parts: tuple[ContentPart, ...] | None = None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    """An OpenAI function tool; ``parameters_json``: its JSON Schema as text (exact, as the
    template renders it), empty for none."""

    name: str
    description: str | None = None
    parameters_json: str = ""
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    messages: tuple[ChatMessage, ...]
    tools: tuple[Tool, ...] = ()
    chat_template_kwargs_json: str = ""  # extra template variables, a JSON object as text; empty: none


@dataclass(frozen=True, slots=True)
class Prompt:
    """At most one of chat, text and token_ids is set (none: an empty prompt, refused)."""

    chat: ChatPrompt | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    images: tuple[ImageInput, ...] = ()  # text or token ids only; a chat's are in its messages
    videos: tuple[VideoInput, ...] = ()  # likewise
    # The request's video processor settings (mm_processor_kwargs: fps, num_frames, ...).
    video_options: VideoOptions = VideoOptions()
    truncation: Truncation | None = None  # vLLM's truncate_prompt_tokens (truncation.py)
