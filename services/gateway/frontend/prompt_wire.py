"""The validated OpenAI models' prompt as the typed PromptInput the preprocess role takes
(protos/tessera.proto): a chat (messages, tools, template variables) or a raw prompt (text or
token ids) with its images and videos, the request's video settings and its truncation; and a
typed Generate prompt scoped to its tenant. The one place the gateway's wire models become the
internal prompt (the pipeline's node calls build their own requests: pipeline/stages.py).

A tenant scopes every image and video uuid to itself (tenants.py), so no tenant can claim another's.
"""

from __future__ import annotations

import json

from protos.gen import pb
from services.gateway.errors import GatewayError
from services.gateway.frontend.tenants import Tenant
from services.gateway.protocol.chat import ChatCompletionRequest, ChatMessage, ImagePart, ImageUrlPart, TextPart, Tool
from services.gateway.protocol.completion import ImageRef, MultiModalData
from services.gateway.protocol.media_fields import MmProcessorKwargs, VideoRef, VideoUrlPart
from services.gateway.protocol.sampling_request import SamplingRequest
from services.preprocess.prompt import Prompt
from services.preprocess.prompt_wire import prompt_from_wire

ROLES = {
    "system": pb.ChatMessage.SYSTEM,
    "developer": pb.ChatMessage.DEVELOPER,
    "user": pb.ChatMessage.USER,
    "assistant": pb.ChatMessage.ASSISTANT,
    "tool": pb.ChatMessage.TOOL,
}


def chat_prompt(
    messages: list[ChatMessage],
    tools: list[Tool] | None,
    template_kwargs: dict | None,
    tenant: Tenant | None = None,
    video_kwargs: MmProcessorKwargs | None = None,
) -> pb.PromptInput:
    chat = pb.ChatPrompt(
        messages=[_message(message, tenant) for message in messages],
        tools=[_tool(tool) for tool in tools or ()],
        chat_template_kwargs_json=json.dumps(template_kwargs) if template_kwargs else "",
    )
    return pb.PromptInput(chat=chat, video_options=_video_options(video_kwargs))


def raw_prompt(
    prompt: str | list[int],
    images: list[str | ImageRef],
    tenant: Tenant | None = None,
    videos: list[VideoRef] = (),
    video_kwargs: MmProcessorKwargs | None = None,
) -> pb.PromptInput:
    """A completion's prompt: text, or token ids, with the images and videos its placeholders stand for."""
    wire_images = [_image(image, None, tenant) if isinstance(image, str) else _image(image.url, image.uuid, tenant) for image in images]
    media = {
        "images": wire_images,
        "videos": [_video(video.url, video.uuid, _scoper(tenant)) for video in videos],
        "video_options": _video_options(video_kwargs),
    }
    if isinstance(prompt, str):
        return pb.PromptInput(text=prompt, **media)
    return pb.PromptInput(token_ids=pb.TokenIds(ids=prompt), **media)


_SIDES = {None: pb.Truncation.TOKENIZER, "left": pb.Truncation.LEFT, "right": pb.Truncation.RIGHT}


def truncation(request: SamplingRequest, max_model_len: int | None) -> pb.Truncation | None:
    """What the prompt's preprocessing is told of ``truncate_prompt_tokens``; None: the prompt
    whole. -1 is the model length less one token, left for the output, as vLLM resolves it."""
    asked = request.truncate_prompt_tokens
    if asked is None:
        return None
    if asked == -1:
        if max_model_len is None:
            message = "truncate_prompt_tokens=-1 is not served here: give the number of tokens"
            raise GatewayError(400, message, param="truncate_prompt_tokens")
        asked = max_model_len - 1
    return pb.Truncation(num_tokens=asked, side=_SIDES[request.truncation_side])


def scoped_prompt(prompt: pb.PromptInput, tenant: Tenant | None) -> pb.PromptInput:
    """A typed prompt with every image and video uuid scoped to the tenant, so no tenant claims
    another's media."""
    if tenant is None:
        return prompt
    scoped = pb.PromptInput()
    scoped.CopyFrom(prompt)
    media = [*scoped.images, *scoped.videos]
    if scoped.WhichOneof("prompt") == "chat":
        parts = [part for message in scoped.chat.messages for part in message.parts.parts]
        media += [getattr(part, kind) for part in parts for kind in ("image", "video") if part.HasField(kind)]
    for item in media:
        if item.HasField("uuid"):
            item.uuid = tenant.image_uuid(item.uuid)
    return scoped


def prompt_for_library(body: dict) -> Prompt:
    """``prompt_from_body`` as the preprocessing library and ``LLM.generate`` take it: through the
    preprocess servicer's conversion, as a request over the API goes."""
    return prompt_from_wire(prompt_from_body(body))


def prompt_from_body(body: dict) -> pb.PromptInput:
    """An in-process caller's OpenAI-shaped body through the HTTP edge's models: a chat body
    (``messages``, ``tools``, ``chat_template_kwargs``), or ``prompt`` / ``prompt_token_ids`` with
    ``images`` (as /v1/completions' multi_modal_data). Raises pydantic's ValidationError."""
    video_kwargs = MmProcessorKwargs.model_validate(body["mm_processor_kwargs"]) if body.get("mm_processor_kwargs") else None
    if "messages" in body:
        request = ChatCompletionRequest.model_validate(body)
        return chat_prompt(request.messages, request.tools, request.chat_template_kwargs, video_kwargs=video_kwargs)
    if ("prompt" in body) == ("prompt_token_ids" in body):
        raise ValueError("give exactly one of 'messages', 'prompt' and 'prompt_token_ids'")
    media = MultiModalData.model_validate({"image": body.get("images") or None, "video": body.get("videos") or None})
    prompt = body["prompt"] if "prompt" in body else list(body["prompt_token_ids"])
    return raw_prompt(prompt, media.images(), videos=media.videos(), video_kwargs=video_kwargs)


def _message(message: ChatMessage, tenant: Tenant | None) -> pb.ChatMessage:
    out = pb.ChatMessage(role=ROLES[message.role])
    if isinstance(message.content, str):
        out.text = message.content
    elif message.content is not None:
        out.parts.SetInParent()  # an empty list of parts is still parts, not "no content"
        out.parts.parts.extend(_part(part, tenant) for part in message.content)
    if message.name is not None:
        out.name = message.name
    for call in message.tool_calls or ():
        out.tool_calls.add(id=call.id, name=call.function.name, arguments=call.function.arguments)
    if message.tool_call_id is not None:
        out.tool_call_id = message.tool_call_id
    return out


def _part(part: TextPart | ImageUrlPart | ImagePart | VideoUrlPart, tenant: Tenant | None) -> pb.ContentPart:
    if isinstance(part, TextPart):
        return pb.ContentPart(text=part.text)
    if isinstance(part, VideoUrlPart):
        return pb.ContentPart(video=_video(part.url, part.uuid, _scoper(tenant)))
    if isinstance(part, ImageUrlPart):
        return pb.ContentPart(image=_image(part.url, part.uuid, tenant))
    return pb.ContentPart(image=_image(part.image, part.uuid, tenant))


def _image(url: str | None, uuid: str | None, tenant: Tenant | None) -> pb.ImageInput:
    if uuid is None:
        return pb.ImageInput(url=url)
    return pb.ImageInput(url=url, uuid=tenant.image_uuid(uuid) if tenant is not None else uuid)


def _scoper(tenant: Tenant | None):
    return tenant.image_uuid if tenant is not None else None


def _video(url: str | None, uuid: str | None, scoped_uuid) -> pb.VideoInput:
    """``scoped_uuid``: the tenant's scoping of a client uuid (tenants.py), or None for none."""
    if uuid is None:
        return pb.VideoInput(url=url)
    return pb.VideoInput(url=url, uuid=scoped_uuid(uuid) if scoped_uuid is not None else uuid)


def _video_options(kwargs: MmProcessorKwargs | None) -> pb.VideoOptions | None:
    if kwargs is None:
        return None
    given = kwargs.model_dump(exclude_none=True)
    if "fps" in given:
        given["fps"] = float(given["fps"])
    return pb.VideoOptions(**given)


def _tool(tool: Tool) -> pb.Tool:
    function = tool.function
    out = pb.Tool(name=function.name)
    if function.description is not None:
        out.description = function.description
    if function.parameters is not None:
        out.parameters_json = json.dumps(function.parameters)
    if function.strict is not None:
        out.strict = function.strict
    return out
