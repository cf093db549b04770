"""The OpenAI models' prompt as a PromptInput, and back out of it on the preprocess side: the chat
template must see exactly the messages, tools and variables the OpenAI body gave (key order too,
as templates serialize them), so prompts render token for token as before."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protos.gen import pb
from services.gateway.frontend.prompt_wire import prompt_for_library, prompt_from_body
from services.gateway.frontend.tenants import Tenant
from services.gateway.protocol.chat import ChatCompletionRequest
from services.preprocess.prompt_input import check_prompt
from services.preprocess.prompt_wire import prompt_from_wire
from tests.factories import tool_call_history


def _template_view(body: dict) -> dict:
    """What the template saw when the gateway sent the OpenAI body as JSON: the model dump, with
    developer as system and an assistant's missing content as ""."""
    request = ChatCompletionRequest.model_validate(body)
    messages = []
    for message in request.messages:
        dumped = message.model_dump(exclude_none=True)
        out = {"role": "system" if dumped["role"] == "developer" else dumped["role"]}
        out.update((key, dumped[key]) for key in ("name", "tool_calls", "tool_call_id") if key in dumped)
        content = dumped.get("content", "")
        out["content"] = content if isinstance(content, str) else [{"type": "image"} if p["type"] != "text" else p for p in content]
        messages.append(out)
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    return {"messages": messages, "tools": tools, "kwargs": request.chat_template_kwargs or None}


def test_a_chat_reaches_the_template_exactly_as_the_openai_body_gave_it():
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "required": ["city"], "maxItems": 3}}},
        {"type": "function", "function": {"name": "noop", "description": "nothing", "parameters": {}, "strict": True}},
    ]
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}, "uuid": "cat"}
    messages = [
        *tool_call_history(),
        {"role": "user", "content": [{"type": "text", "text": "and?"}, image, {"type": "image", "image": "QUJD"}]},
    ]
    body = {"messages": messages, "tools": tools, "chat_template_kwargs": {"enable_thinking": False, "depth": 2}}
    checked = check_prompt(prompt_for_library(body), max_images=8)
    expected = _template_view(body)
    assert checked.template_messages == expected["messages"]
    assert [list(m) for m in checked.template_messages] == [list(m) for m in expected["messages"]]  # key order
    assert checked.tools == expected["tools"] and [list(t["function"]) for t in checked.tools] == [
        ["name", "parameters"],
        list(tools[1]["function"]),
    ]
    assert checked.tools[0]["function"]["parameters"] == tools[0]["function"]["parameters"]
    assert checked.template_kwargs == {"enable_thinking": False, "depth": 2} and isinstance(checked.template_kwargs["depth"], int)
    assert [(i.url, i.uuid) for i in checked.images] == [
        ("data:image/png;base64,AAAA", "cat"),
        ("QUJD", None),
    ]


def test_string_content_and_a_list_of_one_text_part_stay_distinct():
    as_text = check_prompt(prompt_for_library({"messages": [{"role": "user", "content": "hi"}]}), max_images=1)
    as_parts = check_prompt(
        prompt_from_wire(prompt_from_body({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})), max_images=1
    )
    empty = check_prompt(prompt_for_library({"messages": [{"role": "user", "content": []}]}), max_images=1)
    assert as_text.template_messages == [{"role": "user", "content": "hi"}]
    assert as_parts.template_messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert empty.template_messages == [{"role": "user", "content": []}]


def test_raw_prompts_carry_their_images_in_order():
    text = prompt_from_body({"prompt": "<image>", "images": ["data:a", {"url": "data:b", "uuid": "b"}]})
    assert text == pb.PromptInput(text="<image>", images=[pb.ImageInput(url="data:a"), pb.ImageInput(url="data:b", uuid="b")])
    ids = check_prompt(prompt_for_library({"prompt_token_ids": [1, 2]}), max_images=1)
    assert ids.token_ids == (1, 2) and ids.images == () and ids.template_messages is None


def test_a_tenant_scopes_image_uuids():
    from services.gateway.frontend.prompt_wire import chat_prompt

    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "QUJD", "uuid": "cat"}]}]}
    )
    prompt = chat_prompt(request.messages, None, None, Tenant("acme"))
    assert prompt.chat.messages[0].parts.parts[0].image.uuid == "acme/cat"


def test_videos_and_their_settings_reach_the_library_in_prompt_order():
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}, "uuid": "clip"}
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, video, {"type": "video_url", "video_url": "/m/b.mp4"}]}],
        "mm_processor_kwargs": {"fps": 1, "max_pixels": 50176},
    }
    prompt = prompt_for_library(body)
    checked = check_prompt(prompt, max_images=1, max_videos=2)
    assert [v.url for v in checked.videos] == ["data:video/mp4;base64,AAAA", "/m/b.mp4"]
    assert checked.videos[0].uuid == "clip" and checked.videos[1].uuid is None
    assert checked.template_messages[0]["content"][1:] == [{"type": "video"}, {"type": "video"}]
    assert (prompt.video_options.fps, prompt.video_options.max_pixels, prompt.video_options.num_frames) == (1.0, 50176, None)
    body = {"prompt": "<|video_pad|>", "videos": ["data:video/mp4;base64,AAAA"], "mm_processor_kwargs": {"num_frames": 8}}
    raw = prompt_for_library(body)
    assert [v.url for v in raw.videos] == ["data:video/mp4;base64,AAAA"] and raw.video_options.num_frames == 8


def test_a_tenant_scopes_video_uuids_as_it_scopes_image_uuids():
    from services.gateway.frontend.prompt_wire import chat_prompt

    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "/m/a.mp4"}, "uuid": "v1"}]}]}
    )
    wire = chat_prompt(request.messages, None, None, Tenant(name="acme"))
    assert wire.chat.messages[0].parts.parts[0].video.uuid == "acme/v1"


@pytest.mark.parametrize(
    "kwargs,text",
    [
        ({"fps": 2, "num_frames": 4}, "mutually exclusive"),
        ({"min_frames": 9, "max_frames": 4}, "min_frames must not exceed max_frames"),
        ({"fps": 0}, "greater than 0"),
        ({"do_sample_frames": False}, "do_sample_frames"),
        ({"num_frames": 2.5}, "num_frames"),
    ],
)
def test_video_settings_the_server_cannot_honour_are_refused_by_name(kwargs, text):
    body = {"messages": [{"role": "user", "content": "hi"}], "mm_processor_kwargs": kwargs}
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(body)
    assert text in str(info.value)


def test_video_options_off_the_wire_check_themselves():
    from services.preprocess.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="mutually exclusive"):
        prompt_from_wire(pb.PromptInput(text="x", video_options=pb.VideoOptions(fps=2, num_frames=4)))
