"""A Prompt (prompt.py) checked and turned into what the preprocessor consumes: the chat template's
messages (OpenAI-shaped dicts, as templates expect), or the raw text or token ids,
and the images in prompt order.

The sender (the gateway, from its validated OpenAI models) has done the HTTP edge's validation;
what is checked here is what the message's types cannot say and a typed client could still get
wrong: a prompt is set, a chat has messages with valid roles, images only in user turns, content
only missing from assistant turns, uuids of sane length, not too many images, template variables
that are a JSON object and leave the preprocessor's own alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from services.preprocess.errors import InvalidRequestError, TooManyImagesError
from services.preprocess.prompt import ChatMessage, ImageInput, Prompt, Role, Tool, VideoInput

# Templates know the roles by these names; OpenAI's "developer" is the old "system" to them.
TEMPLATE_ROLE = {Role.SYSTEM: "system", Role.DEVELOPER: "system", Role.USER: "user", Role.ASSISTANT: "assistant", Role.TOOL: "tool"}
# Template variables the request may not override: the preprocessor sets them itself (and
# refuses apply_chat_template's own parameters as well).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools"})
MAX_UUID_CHARS = 256


@dataclass(frozen=True, slots=True)
class CheckedPrompt:
    """Exactly one of template_messages, text and token_ids is set."""

    images: tuple[ImageInput, ...]
    videos: tuple[VideoInput, ...] = ()
    template_messages: list[dict] | None = None
    tools: list[dict] | None = None
    template_kwargs: dict | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None


def check_prompt(prompt: Prompt, *, max_images: int, max_videos: int = 0) -> CheckedPrompt:
    num_kinds = sum(kind is not None for kind in (prompt.chat, prompt.text, prompt.token_ids))
    if num_kinds != 1:
        what = "empty" if num_kinds == 0 else "more than one kind"
        raise InvalidRequestError(f"the prompt is {what}: give chat messages, text or token ids")
    if prompt.chat is not None:
        if prompt.images or prompt.videos:
            raise InvalidRequestError("a chat's images and videos go in its messages, not beside them")
        messages, images, videos = _template_messages(prompt.chat.messages)
        checked = CheckedPrompt(
            images=tuple(images),
            videos=tuple(videos),
            template_messages=messages,
            tools=[_tool(tool) for tool in prompt.chat.tools] or None,
            template_kwargs=_template_kwargs(prompt.chat.chat_template_kwargs_json),
        )
    elif prompt.text is not None:
        checked = CheckedPrompt(images=prompt.images, videos=prompt.videos, text=prompt.text)
    else:
        checked = CheckedPrompt(images=prompt.images, videos=prompt.videos, token_ids=prompt.token_ids)
    for i, image in enumerate(checked.images):
        _check_source(image, f"image {i}")
    for i, video in enumerate(checked.videos):
        _check_source(video, f"video {i}")
    if len(checked.images) > max_images:
        raise TooManyImagesError(f"request has {len(checked.images)} images; at most {max_images} are allowed")
    if len(checked.videos) > max_videos:
        raise TooManyImagesError(f"request has {len(checked.videos)} videos; at most {max_videos} are allowed")
    return checked


def _template_messages(messages: tuple[ChatMessage, ...]) -> tuple[list[dict], list[ImageInput], list[VideoInput]]:
    if not messages:
        raise InvalidRequestError("'messages' must not be empty")
    rendered: list[dict] = []
    images: list[ImageInput] = []
    videos: list[VideoInput] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = TEMPLATE_ROLE.get(message.role)
        if role is None:
            raise InvalidRequestError(f"{where}.role must be one of system, developer, user, assistant, tool")
        # Keys in the order the OpenAI body had them, so a template sees what it saw before.
        out: dict = {"role": role}
        if message.name is not None:
            out["name"] = message.name
        if message.tool_calls:
            if role != "assistant":
                raise InvalidRequestError(f"{where}: only assistant messages carry tool_calls")
            out["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in message.tool_calls
            ]
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.text is not None:
            out["content"] = message.text
        elif message.parts is None:
            if role != "assistant":
                raise InvalidRequestError(f"{where}: a {role} message needs content")
            out["content"] = ""
        else:
            parts: list[dict] = []
            for j, part in enumerate(message.parts):
                if part.text is not None:
                    parts.append({"type": "text", "text": part.text})
                elif part.image is not None:
                    if role != "user":
                        raise InvalidRequestError(f"{where}.content[{j}]: images are only allowed in user messages")
                    parts.append({"type": "image"})
                    images.append(part.image)
                elif part.video is not None:
                    if role != "user":
                        raise InvalidRequestError(f"{where}.content[{j}]: videos are only allowed in user messages")
                    parts.append({"type": "video"})
                    videos.append(part.video)
                else:
                    raise InvalidRequestError(f"{where}.content[{j}] is empty: give text, an image or a video")
            out["content"] = parts
        rendered.append(out)
    return rendered, images, videos


def _tool(tool: Tool) -> dict:
    function: dict = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.parameters_json:
        function["parameters"] = _json_object(tool.parameters_json, f"tool {tool.name!r} parameters")
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _template_kwargs(text: str) -> dict | None:
    if not text:
        return None
    kwargs = _json_object(text, "chat_template_kwargs")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise InvalidRequestError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    return kwargs or None


def _json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object")
    return value


def _check_source(media: ImageInput | VideoInput, where: str) -> None:
    if media.data is None and media.url is None and media.uuid is None:
        raise InvalidRequestError(f"{where} has no source: give its bytes, a URL, or the uuid it was sent with before")
    if media.data is not None and media.url is not None:
        raise InvalidRequestError(f"{where} has two sources: give its bytes or a URL, not both")
    uuid = media.uuid
    if uuid is not None and not 0 < len(uuid) <= MAX_UUID_CHARS:
        raise InvalidRequestError(f"{where}: uuid must be a non-empty string of at most {MAX_UUID_CHARS} characters")
