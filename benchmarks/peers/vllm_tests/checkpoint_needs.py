"""The vLLM entrypoint tests that need a real checkpoint, by name, each with why and the symptom
its failure shows on the built-in ``tiny`` (outcomes.py counts a listed test as needing the
checkpoint only when it fails with that symptom before any assertion; any other failure is a
failure).

Why a built-in cannot stand in: the Hub is out of reach, so a test that loads a model's files
itself (a tokenizer, a config, a LoRA adapter) fails before it judges the server's answer. Tests
whose assertions a built-in cannot meet (random weights never choose EOS) are not listed: they
count as failures on both servers, and docs/benchmarks.md names them.
"""

from __future__ import annotations

from dataclasses import dataclass

HUB = (
    r"Invalid repository ID or local directory|huggingface\.co|LocalEntryNotFoundError|OfflineModeIsEnabled|HFValidationError"
    r"|RepositoryNotFoundError|couldn't connect"
)
LORA = HUB  # the adapter comes from the Hub too


@dataclass(frozen=True, slots=True)
class Need:
    reason: str
    symptom: str  # a regular expression the failure's message or traceback matches


# One entry per test that failed on the Hub on either server in the recorded run (0.32.0, built-in
# tiny); outcomes.py counts it so only while it fails that way.
NEEDS_CHECKPOINT: dict[str, Need] = {
    "chat_completion/test_batched_chat_completions.py::test_batched_harmony_response_format_uses_structural_tag": Need(
        "builds vLLM's serving objects on a mock engine, which load Qwen/Qwen2.5-1.5B-Instruct's tokenizer from the Hub", HUB
    ),
    "chat_completion/test_batched_chat_completions.py::test_batched_reasoning_wiring_matches_single_chat": Need(
        "builds vLLM's serving objects on a mock engine, which load Qwen/Qwen2.5-1.5B-Instruct's tokenizer from the Hub", HUB
    ),
    "chat_completion/test_chat.py::test_chat_completion_n_equals_1[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_completion_n_parameter_non_streaming[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_completion_n_parameter_streaming[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_completion_n_with_seed[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_completion_stream_options[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_completion_stream_options[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_streaming[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_chat_streaming[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_complex_message_content": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_custom_role": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_extra_fields_allowed": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_invocations": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_long_seed": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_more_than_one_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_no_logprobs_chat[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_no_logprobs_chat[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta--1]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta-0]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta-1]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_prompt_logprobs_chat[HuggingFaceH4/zephyr-7b-beta-None]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_response_format_json_object": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_response_format_json_schema": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_response_format_text": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_single_chat_session[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_single_chat_session[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_some_logprobs_chat[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_some_logprobs_chat[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_structured_outputs_choice_chat": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_structured_outputs_choice_chat_logprobs": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_structured_outputs_json_chat": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_structured_outputs_regex_chat": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_structured_outputs_type_error": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_too_many_chat_logprobs[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_too_many_chat_logprobs[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_zero_logprobs_chat[HuggingFaceH4/zephyr-7b-beta]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat.py::test_zero_logprobs_chat[zephyr-lora]": Need(
        "the module's server fixture downloads the LoRA adapter typeof/zephyr-7b-beta-lora from the Hub before any test runs", LORA
    ),
    "chat_completion/test_chat_echo.py::test_top_logprobs": Need(
        "asks vLLM's ModelConfig for Qwen/Qwen2-1.5B-Instruct's vocabulary size (the Hub's config)", HUB
    ),
    "chat_completion/test_chat_logit_bias_validation.py::test_chat_logit_bias_invalid": Need(
        "asks vLLM's ModelConfig for Qwen/Qwen2.5-1.5B-Instruct's vocabulary size (the Hub's config)", HUB
    ),
    "chat_completion/test_chat_logit_bias_validation.py::test_chat_logit_bias_valid": Need(
        "asks vLLM's ModelConfig for Qwen/Qwen2.5-1.5B-Instruct's vocabulary size (the Hub's config)", HUB
    ),
    "completion/test_completion.py::test_echo_logprob_completion[0-facebook/opt-125m]": Need(
        "checks the echoed prompt with facebook/opt-125m's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
    "completion/test_completion.py::test_echo_logprob_completion[1-facebook/opt-125m]": Need(
        "checks the echoed prompt with facebook/opt-125m's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
    "test_return_token_ids.py::test_basic_completion_with_emoji[True]": Need(
        "decodes the returned ids with the model's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
    "test_return_token_ids.py::test_chat_completion_with_emoji_and_token_ids": Need(
        "decodes the returned ids with the model's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
    "test_return_token_ids.py::test_chat_completion_with_tool_use": Need(
        "decodes the returned ids with the model's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
    "test_return_token_ids.py::test_comparison_with_prompt_logprobs_and_logprobs": Need(
        "decodes the returned ids with the model's tokenizer, loaded from the Hub (get_tokenizer)", HUB
    ),
}
