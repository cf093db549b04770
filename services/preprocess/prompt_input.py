"""A PromptInput (protos/tessera.proto) checked and turned into what the preprocessor consumes: the
chat template's messages (OpenAI-shaped dicts, as templates expect), or the raw text or token ids,
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

from protos.gen import pb
from services.preprocess.errors import InvalidRequestError, TooManyImagesError

Role = pb.ChatMessage.Role
# Templates know the roles by these names; OpenAI's "developer" is the old "system" to them.
TEMPLATE_ROLE = {Role.SYSTEM: "system", Role.DEVELOPER: "system", Role.USER: "user", Role.ASSISTANT: "assistant", Role.TOOL: "tool"}
# Template variables the request may not override: the preprocessor sets them itself (and
# refuses apply_chat_template's own parameters as well).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools"})
MAX_UUID_CHARS = 256


@dataclass(frozen=True, slots=True)
class CheckedPrompt:
    """Exactly one of template_messages, text and token_ids is set."""

    images: tuple[pb.ImageInput, ...]
    template_messages: list[dict] | None = None
    tools: list[dict] | None = None
    template_kwargs: dict | None = None
    text: str | None = None
    token_ids: tuple[int, ...] | None = None


def check_prompt(prompt: pb.PromptInput, *, max_images: int) -> CheckedPrompt:
    kind = prompt.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequestError("the prompt is empty: give chat messages, text or token ids")
    if kind == "chat":
        if prompt.images:
            raise InvalidRequestError("a chat's images go in its messages, not beside them")
        messages, images = _template_messages(prompt.chat.messages)
        checked = CheckedPrompt(
            images=tuple(images),
            template_messages=messages,
            tools=[_tool(tool) for tool in prompt.chat.tools] or None,
            template_kwargs=_template_kwargs(prompt.chat.chat_template_kwargs_json),
        )
    elif kind == "text":
        checked = CheckedPrompt(images=tuple(prompt.images), text=prompt.text)
    else:
        checked = CheckedPrompt(images=tuple(prompt.images), token_ids=tuple(prompt.token_ids.ids))
    for i, image in enumerate(checked.images):
        _check_image(image, f"image {i}")
    if len(checked.images) > max_images:
        raise TooManyImagesError(f"request has {len(checked.images)} images; at most {max_images} are allowed")
    return checked


def image_uuid(image: pb.ImageInput) -> str | None:
    return image.uuid if image.HasField("uuid") else None


def _template_messages(messages) -> tuple[list[dict], list[pb.ImageInput]]:
    if not messages:
        raise InvalidRequestError("'messages' must not be empty")
    rendered: list[dict] = []
    images: list[pb.ImageInput] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = TEMPLATE_ROLE.get(message.role)
        if role is None:
            raise InvalidRequestError(f"{where}.role must be one of system, developer, user, assistant, tool")
        # Keys in the order the OpenAI body had them, so a template sees what it saw before.
        out: dict = {"role": role}
        if message.HasField("name"):
            out["name"] = message.name
        if message.tool_calls:
            if role != "assistant":
                raise InvalidRequestError(f"{where}: only assistant messages carry tool_calls")
            out["tool_calls"] = [
                {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in message.tool_calls
            ]
        if message.HasField("tool_call_id"):
            out["tool_call_id"] = message.tool_call_id
        content = message.WhichOneof("content")
        if content == "text":
            out["content"] = message.text
        elif content is None:
            if role != "assistant":
                raise InvalidRequestError(f"{where}: a {role} message needs content")
            out["content"] = ""
        else:
            parts: list[dict] = []
            for j, part in enumerate(message.parts.parts):
                if part.WhichOneof("part") == "text":
                    parts.append({"type": "text", "text": part.text})
                elif part.WhichOneof("part") == "image":
                    if role != "user":
                        raise InvalidRequestError(f"{where}.content[{j}]: images are only allowed in user messages")
                    parts.append({"type": "image"})
                    images.append(part.image)
                else:
                    raise InvalidRequestError(f"{where}.content[{j}] is empty: give text or an image")
            out["content"] = parts
        rendered.append(out)
    return rendered, images


def _tool(tool: pb.Tool) -> dict:
    function: dict = {"name": tool.name}
    if tool.HasField("description"):
        function["description"] = tool.description
    if tool.parameters_json:
        function["parameters"] = _json_object(tool.parameters_json, f"tool {tool.name!r} parameters")
    if tool.HasField("strict"):
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


def _check_image(image: pb.ImageInput, where: str) -> None:
    if image.WhichOneof("source") is None:
        raise InvalidRequestError(f"{where} has no source: give its bytes or a URL")
    uuid = image_uuid(image)
    if uuid is not None and not 0 < len(uuid) <= MAX_UUID_CHARS:
        raise InvalidRequestError(f"{where}: uuid must be a non-empty string of at most {MAX_UUID_CHARS} characters")
