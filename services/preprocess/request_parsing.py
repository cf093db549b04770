"""Validate an incoming request body and split it into a prompt and its image references.

Three prompt shapes are accepted (exactly one per request):
  {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}
                                              OpenAI chat messages, rendered by the chat template
                                              (with the tools and the extra template variables)
  {"prompt": "text with the model's image marker", "images": [...]}
                                              (<|image_pad|> for Qwen2-VL, <start_of_image> for Gemma3)
  {"prompt_token_ids": [ints], "images": [...]}   already tokenized, one placeholder per image
Image content parts in messages:
  {"type": "image_url", "image_url": {"url": "data:..."}}  (or "image_url": "data:...")
  {"type": "image", "image": "<base64>"}                     (a bare base64 image part)
Either may carry "uuid": a client-supplied stable id used for mm_hash instead of the pixels.

Roles: system, developer (OpenAI's newer name for system, rendered as system: chat templates
know only the old one), user, assistant (with optional tool_calls) and tool (with
tool_call_id). Messages keep their name, tool_calls and tool_call_id for the template.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.preprocess.errors import InvalidRequestError, TooManyImagesError

ALLOWED_ROLES = ("system", "developer", "user", "assistant", "tool")
TEMPLATE_ROLE = {"developer": "system"}
MESSAGE_KEYS_FOR_TEMPLATE = ("name", "tool_calls", "tool_call_id")
# Template variables the request may not override: the preprocessor sets them itself (and
# refuses apply_chat_template's own parameters as well).
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools"})


@dataclass(frozen=True, slots=True)
class ImageInput:
    reference: str  # data URL, base64, http(s) URL or local path
    uuid: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    images: tuple[ImageInput, ...]
    template_messages: list[dict] | None = None
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    tools: list[dict] | None = None
    template_kwargs: dict | None = None


def parse_request(body: object, *, max_images: int) -> ParsedRequest:
    if not isinstance(body, Mapping):
        raise InvalidRequestError(f"request body must be a JSON object, got {type(body).__name__}")
    shapes = [key for key in ("messages", "prompt", "prompt_token_ids") if key in body]
    if len(shapes) != 1:
        raise InvalidRequestError("request must contain exactly one of 'messages', 'prompt' or 'prompt_token_ids'")
    if shapes[0] == "messages":
        if "images" in body:
            raise InvalidRequestError("'images' is only allowed with 'prompt' or 'prompt_token_ids'")
        messages, images = _parse_messages(body["messages"])
        parsed = ParsedRequest(
            images=tuple(images), template_messages=messages, tools=_parse_tools(body.get("tools")), template_kwargs=_parse_kwargs(body)
        )
    else:
        images = [_parse_image_entry(entry, f"images[{i}]") for i, entry in enumerate(_as_list(body.get("images", []), "images"))]
        if shapes[0] == "prompt":
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise InvalidRequestError("'prompt' must be a string")
            parsed = ParsedRequest(images=tuple(images), prompt_text=prompt)
        else:
            token_ids = _as_list(body["prompt_token_ids"], "prompt_token_ids")
            if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in token_ids):
                raise InvalidRequestError("'prompt_token_ids' must be a list of non-negative integers")
            parsed = ParsedRequest(images=tuple(images), prompt_token_ids=tuple(token_ids))
    if len(parsed.images) > max_images:
        raise TooManyImagesError(f"request has {len(parsed.images)} images; at most {max_images} are allowed")
    return parsed


def _as_list(value: object, name: str) -> list:
    if not isinstance(value, list):
        raise InvalidRequestError(f"'{name}' must be a list, got {type(value).__name__}")
    return value


def _parse_messages(raw: object) -> tuple[list[dict], list[ImageInput]]:
    messages = _as_list(raw, "messages")
    if not messages:
        raise InvalidRequestError("'messages' must not be empty")
    rendered: list[dict] = []
    images: list[ImageInput] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"{where} must be an object")
        role = message.get("role")
        if role not in ALLOWED_ROLES:
            raise InvalidRequestError(f"{where}.role must be one of {', '.join(ALLOWED_ROLES)}, got {role!r}")
        out = {"role": TEMPLATE_ROLE.get(role, role)}
        out.update((key, message[key]) for key in MESSAGE_KEYS_FOR_TEMPLATE if message.get(key) is not None)
        content = message.get("content")
        if isinstance(content, str):
            out["content"] = content
        elif content is None and role == "assistant":
            out["content"] = ""
        else:
            parts = _as_list(content, f"{where}.content")
            rendered_parts: list[dict] = []
            for j, part in enumerate(parts):
                rendered_part, image = _parse_part(part, f"{where}.content[{j}]", role)
                rendered_parts.append(rendered_part)
                if image is not None:
                    images.append(image)
            out["content"] = rendered_parts
        rendered.append(out)
    return rendered, images


def _parse_tools(raw: object) -> list[dict] | None:
    if raw is None:
        return None
    tools = _as_list(raw, "tools")
    if not all(isinstance(tool, Mapping) for tool in tools):
        raise InvalidRequestError("'tools' must be a list of objects")
    return [dict(tool) for tool in tools] or None


def _parse_kwargs(body: Mapping) -> dict | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, Mapping):
        raise InvalidRequestError("'chat_template_kwargs' must be an object")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise InvalidRequestError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    return dict(kwargs)


def _parse_part(part: object, where: str, role: str) -> tuple[dict, ImageInput | None]:
    if not isinstance(part, Mapping):
        raise InvalidRequestError(f"{where} must be an object")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequestError(f"{where}.text must be a string")
        return {"type": "text", "text": text}, None
    if kind in ("image_url", "image"):
        if role != "user":
            raise InvalidRequestError(f"{where}: images are only allowed in user messages")
        raw = part.get(kind)
        if kind == "image_url" and isinstance(raw, Mapping):
            raw = raw.get("url")
        if not isinstance(raw, str) or not raw:
            raise InvalidRequestError(f"{where}.{kind} must be a non-empty string" + (' or {"url": ...}' if kind == "image_url" else ""))
        return {"type": "image"}, ImageInput(reference=raw, uuid=_parse_uuid(part, where))
    raise InvalidRequestError(f"{where}: unsupported content part type {kind!r} (expected 'text', 'image_url' or 'image')")


def _parse_image_entry(entry: object, where: str) -> ImageInput:
    if isinstance(entry, str) and entry:
        return ImageInput(reference=entry)
    if isinstance(entry, Mapping):
        url = entry.get("url", entry.get("image"))
        if isinstance(url, str) and url:
            return ImageInput(reference=url, uuid=_parse_uuid(entry, where))
    raise InvalidRequestError(f"{where} must be a non-empty string or an object with 'url'")


def _parse_uuid(part: Mapping, where: str) -> str | None:
    uuid = part.get("uuid")
    if uuid is None:
        return None
    if not isinstance(uuid, str) or not uuid or len(uuid) > 256:
        raise InvalidRequestError(f"{where}.uuid must be a non-empty string of at most 256 characters")
    return uuid
