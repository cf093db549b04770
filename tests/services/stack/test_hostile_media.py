"""Hostile and damaged media through the official client on the session's real stack: every
damaged image and MP4 (tests/damaged_media.py) gets a 4xx with OpenAI's error body, the two
headers of the original report (a 60000x60000 bomb, then a 0x0 image) each get theirs on one
keep-alive connection, MP4s whose headers lie get no 5xx, and afterwards the gateway is the same
process (no restart) and answers a good request. Through gRPC Generate, the same corpus gets the
status HTTP gave each case (the status code matching it, and the HTTP status in a trailer)."""

from __future__ import annotations

import http.client
import json

import grpc
import httpx
import openai
import pytest

from protos.gen import pb, rpc
from services.gateway.generate.server import HTTP_STATUS_KEY
from tests.damaged_media import damaged_clips, damaged_images, lying_clip_headers
from tests.factories import data_url
from tests.services.stack.e2e_helpers import client_for, png


def image_message(data: bytes) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(data)}}, {"type": "text", "text": "?"}]}]


def clip_message(data: bytes) -> list[dict]:
    video = {"type": "video_url", "video_url": {"url": data_url(data, "video/mp4")}}
    return [{"role": "user", "content": [video, {"type": "text", "text": "?"}]}]


def ask(stack, messages: list[dict]):
    return client_for(stack).chat.completions.create(model="tiny", messages=messages, max_tokens=2, temperature=0)


def refusal(stack, messages: list[dict]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        ask(stack, messages)
    return info.value


def gateway_state(stack) -> dict:
    return stack.state()["roles"]["gateway"]


def test_every_damaged_image_and_clip_gets_a_4xx_naming_what_is_wrong_and_the_gateway_lives_on(stack):
    before = gateway_state(stack)
    for name, data in damaged_images().items():
        error = refusal(stack, image_message(data))
        assert error.status_code in (400, 413), (name, error.status_code, error.message)
        assert error.body["message"] and error.body["type"] == "invalid_request_error", name
    for name, data in damaged_clips().items():
        error = refusal(stack, clip_message(data))
        assert error.status_code in (400, 413), (name, error.status_code, error.message)
        assert "video" in error.body["message"], (name, error.body["message"])
    for name, data in lying_clip_headers().items():  # FFmpeg may read these regardless: a reply or a 4xx, never a 5xx
        try:
            assert ask(stack, clip_message(data)).choices[0].message.content is not None, name
        except openai.APIStatusError as error:
            assert 400 <= error.status_code < 500, (name, error.status_code, error.message)
    assert gateway_state(stack) == before  # the same process, never restarted
    assert httpx.get(stack.base_url.removesuffix("/v1") + "/health", timeout=30).status_code == 200
    assert ask(stack, image_message(png(64, 48, 7))).choices[0].message.content is not None


def test_a_bomb_header_then_a_zero_size_one_on_one_connection_each_get_a_4xx(stack):
    address = httpx.URL(stack.base_url)
    connection = http.client.HTTPConnection(address.host, address.port, timeout=60)
    answers, sockets = [], []
    for data in (damaged_images()["png bomb 60000x60000"], damaged_images()["png 0x0"], png(64, 48, 8)):
        body = {"model": "tiny", "messages": image_message(data), "max_tokens": 2}
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        response = connection.getresponse()
        answers.append((response.status, json.loads(response.read()), response.will_close))
        sockets.append(connection.sock)
    connection.close()
    (bomb, bomb_body, _), (zero, zero_body, _), (good, _, _) = answers
    assert bomb in (400, 413) and bomb_body["error"]["message"], answers
    assert zero == 400 and "zero size" in zero_body["error"]["message"], answers
    assert good == 200
    assert not any(will_close for *_, will_close in answers) and sockets[0] is sockets[1] is sockets[2]  # one connection throughout


# The gRPC status each HTTP status of the public API maps to (the Generate door's contract).
HTTP_TO_GRPC = {400: grpc.StatusCode.INVALID_ARGUMENT, 413: grpc.StatusCode.RESOURCE_EXHAUSTED}


def generate_refusal(stub, part: pb.ContentPart) -> grpc.RpcError:
    parts = pb.ContentParts(parts=[part, pb.ContentPart(text="?")])
    prompt = pb.PromptInput(chat=pb.ChatPrompt(messages=[pb.ChatMessage(role=pb.ChatMessage.USER, parts=parts)]))
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Generate(pb.GenerateRequest(prompt=prompt, sampling=pb.SamplingParams(max_tokens=2)), timeout=60))
    return info.value


def test_through_generate_each_damaged_image_and_clip_gets_the_status_http_gives_it(stack):
    cases = [(f"image {n}", image_message(d), pb.ContentPart(image=pb.ImageInput(data=d))) for n, d in damaged_images().items()]
    cases += [(f"clip {n}", clip_message(d), pb.ContentPart(video=pb.VideoInput(data=d))) for n, d in damaged_clips().items()]
    with grpc.insecure_channel(stack.generate_address) as channel:
        stub = rpc.GenerateStub(channel)
        for name, messages, part in cases:
            status = refusal(stack, messages).status_code
            error = generate_refusal(stub, part)
            trailer = dict(error.trailing_metadata() or ())
            assert (error.code(), trailer.get(HTTP_STATUS_KEY)) == (HTTP_TO_GRPC[status], str(status)), (name, error.details())
            assert error.details(), name
