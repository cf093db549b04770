"""A PromptInput (protos/tessera.proto) as the preprocessing library takes it (prompt.py): the
one conversion, made by the servicer at the edge. Nothing is checked here (prompt_input.py does,
on the converted prompt), so an unset field stays unset and is refused there with its reason;
only the video options check themselves (VideoOptions), answered as an invalid request."""

from __future__ import annotations

from protos.gen import pb
from services.models.video import VIDEO_OPTION_NAMES, VideoOptions
from services.preprocess.errors import InvalidRequestError
from services.preprocess.prompt import ChatMessage, ChatPrompt, ContentPart, ImageInput, Prompt, Role, Tool, ToolCall, VideoInput
from services.preprocess.truncation import Truncation

_WIRE_ROLES = {
    pb.ChatMessage.SYSTEM: Role.SYSTEM,
    pb.ChatMessage.DEVELOPER: Role.DEVELOPER,
    pb.ChatMessage.USER: Role.USER,
    pb.ChatMessage.ASSISTANT: Role.ASSISTANT,
    pb.ChatMessage.TOOL: Role.TOOL,
}


def prompt_from_wire(prompt: pb.PromptInput) -> Prompt:
    """A PromptInput as the library takes it; nothing is checked here (prompt_input.py does)."""
    media = {
        "images": tuple(image_from_wire(image) for image in prompt.images),
        "videos": tuple(video_from_wire(video) for video in prompt.videos),
        "video_options": video_options_from_wire(prompt.video_options),
        "truncation": truncation_from_wire(prompt.truncation) if prompt.HasField("truncation") else None,
    }
    kind = prompt.WhichOneof("prompt")
    if kind == "chat":
        chat = prompt.chat
        messages = tuple(_message(message) for message in chat.messages)
        return Prompt(chat=ChatPrompt(messages, tuple(_tool(tool) for tool in chat.tools), chat.chat_template_kwargs_json), **media)
    if kind == "text":
        return Prompt(text=prompt.text, **media)
    if kind == "token_ids":
        return Prompt(token_ids=tuple(prompt.token_ids.ids), **media)
    return Prompt(**media)


_SIDES = {pb.Truncation.TOKENIZER: None, pb.Truncation.LEFT: "left", pb.Truncation.RIGHT: "right"}


def truncation_from_wire(truncation: pb.Truncation) -> Truncation:
    return Truncation(truncation.num_tokens, _SIDES.get(truncation.side))


def video_from_wire(video: pb.VideoInput) -> VideoInput:
    source = video.WhichOneof("source")
    uuid = video.uuid if video.HasField("uuid") else None
    return VideoInput(data=video.data if source == "data" else None, url=video.url if source == "url" else None, uuid=uuid)


def video_options_from_wire(options: pb.VideoOptions) -> VideoOptions:
    try:
        return VideoOptions(**{name: getattr(options, name) for name in VIDEO_OPTION_NAMES if options.HasField(name)})
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def image_from_wire(image: pb.ImageInput) -> ImageInput:
    source = image.WhichOneof("source")
    uuid = image.uuid if image.HasField("uuid") else None
    return ImageInput(data=image.data if source == "data" else None, url=image.url if source == "url" else None, uuid=uuid)


def _message(message: pb.ChatMessage) -> ChatMessage:
    content = message.WhichOneof("content")
    return ChatMessage(
        role=_WIRE_ROLES.get(message.role),
        text=message.text if content == "text" else None,
        parts=tuple(_part(part) for part in message.parts.parts) if content == "parts" else None,
        name=message.name if message.HasField("name") else None,
        tool_calls=tuple(ToolCall(call.id, call.name, call.arguments) for call in message.tool_calls),
        tool_call_id=message.tool_call_id if message.HasField("tool_call_id") else None,
    )


def _part(part: pb.ContentPart) -> ContentPart:
    kind = part.WhichOneof("part")
    if kind == "text":
        return ContentPart(text=part.text)
    if kind == "video":
        return ContentPart(video=video_from_wire(part.video))
    return ContentPart(image=image_from_wire(part.image)) if kind == "image" else ContentPart()


def _tool(tool: pb.Tool) -> Tool:
    description = tool.description if tool.HasField("description") else None
    return Tool(tool.name, description, tool.parameters_json, tool.strict if tool.HasField("strict") else None)
