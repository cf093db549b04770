"""The preprocess servicer's one conversion: every field of a PromptInput reaches the library's
Prompt, set or unset as it was (an unset field stays None, for prompt_input.py to refuse)."""

from __future__ import annotations

from protos.gen import pb
from services.preprocess.prompt import ChatMessage, ContentPart, ImageInput, Prompt, Role, Tool, ToolCall
from services.preprocess.prompt_wire import prompt_from_wire


def test_a_chat_keeps_every_field():
    wire = pb.PromptInput(
        chat=pb.ChatPrompt(
            messages=[
                pb.ChatMessage(role=pb.ChatMessage.DEVELOPER, text="be brief", name="ops"),
                pb.ChatMessage(
                    role=pb.ChatMessage.USER,
                    parts=pb.ContentParts(
                        parts=[pb.ContentPart(text="look"), pb.ContentPart(image=pb.ImageInput(url="data:x", uuid="cat"))]
                    ),
                ),
                pb.ChatMessage(role=pb.ChatMessage.ASSISTANT, tool_calls=[pb.ToolCall(id="1", name="f", arguments="{}")]),
                pb.ChatMessage(role=pb.ChatMessage.TOOL, text="42", tool_call_id="1"),
            ],
            tools=[pb.Tool(name="f", description="adds", parameters_json='{"type": "object"}', strict=True), pb.Tool(name="g")],
            chat_template_kwargs_json='{"enable_thinking": false}',
        )
    )
    chat = prompt_from_wire(wire).chat
    assert chat is not None and chat.chat_template_kwargs_json == '{"enable_thinking": false}'
    assert chat.messages == (
        ChatMessage(Role.DEVELOPER, text="be brief", name="ops"),
        ChatMessage(Role.USER, parts=(ContentPart(text="look"), ContentPart(image=ImageInput(url="data:x", uuid="cat")))),
        ChatMessage(Role.ASSISTANT, tool_calls=(ToolCall("1", "f", "{}"),)),
        ChatMessage(Role.TOOL, text="42", tool_call_id="1"),
    )
    assert chat.tools == (Tool("f", "adds", '{"type": "object"}', True), Tool("g"))


def test_empty_parts_stay_parts_and_an_unknown_role_stays_unknown():
    wire = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, parts=pb.ContentParts())]))
    assert prompt_from_wire(wire).chat.messages == (ChatMessage(Role.USER, parts=()),)
    unknown = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(text="hi")]))
    assert prompt_from_wire(unknown).chat.messages[0].role is None


def test_raw_prompts_carry_their_images():
    images = [pb.ImageInput(data=b"png"), pb.ImageInput(url="/m/a.png")]
    assert prompt_from_wire(pb.PromptInput(text="<image>", images=images)) == Prompt(
        text="<image>", images=(ImageInput(data=b"png"), ImageInput(url="/m/a.png"))
    )
    assert prompt_from_wire(pb.PromptInput(token_ids=pb.TokenIds(ids=[1, 2]))) == Prompt(token_ids=(1, 2))
    assert prompt_from_wire(pb.PromptInput()) == Prompt()
