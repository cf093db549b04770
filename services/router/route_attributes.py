"""A route as trace-span attributes: which nodes were chosen, what each already held of the
request, and a one-line reason, so a trace shows why a request went where it did."""

from __future__ import annotations

from services.router.route import Route

AttributeValue = str | int | float


def route_attributes(route: Route, *, policy: str, num_images: int, num_prompt_tokens: int) -> dict[str, AttributeValue]:
    prefill_prefix = route.prefix_tokens_by_node.get(route.prefill, 0)
    best_node, best_prefix = max(route.prefix_tokens_by_node.items(), key=lambda item: (item[1], item[0]), default=("", 0))
    attributes: dict[str, AttributeValue] = {
        "tessera.route.policy": policy,
        "tessera.route.encoder": route.encoder,
        "tessera.route.prefill": route.prefill,
        "tessera.route.decode": route.decode or "",
        "tessera.route.images": num_images,
        "tessera.route.images_on_encoder": len(route.images_on_encoder),
        "tessera.route.images_encoded_on_prefill": len(route.local_encode),
        "tessera.route.images_on_prefill": len(route.images_on_prefill),
        "tessera.route.images_from_other_holders": len(route.image_to_source),
        "tessera.route.prompt_tokens": num_prompt_tokens,
        "tessera.route.prefill_prefix_tokens": prefill_prefix,
        "tessera.route.decision_ms": round(route.decision_s * 1e3, 3),
        "tessera.route.reason": route_reason(route, policy=policy, num_images=num_images, num_prompt_tokens=num_prompt_tokens),
    }
    if best_prefix > prefill_prefix:
        attributes["tessera.route.kv_source"] = best_node
        attributes["tessera.route.kv_source_prefix_tokens"] = best_prefix
    return attributes


def route_reason(route: Route, *, policy: str, num_images: int, num_prompt_tokens: int) -> str:
    """E.g. "cache_aware: encoder holds 1/1 images; prefill holds 48/60 prompt tokens"."""
    parts = []
    if num_images:
        parts.append(f"encoder holds {len(route.images_on_encoder)}/{num_images} images")
    if route.image_to_source:
        parts.append(f"{len(route.image_to_source)} image(s) shipped by other holders")
    if route.local_encode:
        parts.append(f"prefill encodes {len(route.local_encode)} image(s) itself (the encoder tier is queued)")
    prefix = route.prefix_tokens_by_node.get(route.prefill, 0)
    if route.prefix_tokens_by_node or policy == "cache_aware":
        parts.append(f"prefill holds {prefix}/{num_prompt_tokens} prompt tokens")
    return f"{policy}: " + ("; ".join(parts) if parts else "no cached work to place by")
