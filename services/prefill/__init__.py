"""The prefill role: paged prefill with multimodal prefix caching; ships KV pages to decode."""
