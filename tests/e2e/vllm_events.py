"""vLLM's KV events decoded from vLLM's own field list (vllm/distributed/kv_events.py), as a
prefix-aware router decodes them: an event is a map tagged by `type` (vLLM's format since June
2026, sluice's default) or an array of the same fields by position, the tag first
(`--kv-events-format array`). Fields an event leaves out are None, as msgspec gives defaults."""

from __future__ import annotations

# The fields after the tag, in vLLM's declaration order (the array form's positions).
FIELDS = {
    "BlockStored": [
        "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
        "kv_cache_spec_sliding_window", "locality", "ownership", "session_id",
    ],
    "BlockRemoved": ["block_hashes", "medium", "group_idx", "locality", "ownership"],
    "AllBlocksCleared": [],
}
# Fields without a default in vLLM's structs: every encoding carries them.
REQUIRED = {
    "BlockStored": FIELDS["BlockStored"][:7],
    "BlockRemoved": FIELDS["BlockRemoved"][:2],
    "AllBlocksCleared": [],
}


def decode_event(event) -> tuple[str, dict, str]:
    """(tag, every field by name, "map" or "array") of one decoded event."""
    if isinstance(event, dict):
        tag, form = event["type"], "map"
        given = {k: v for k, v in event.items() if k != "type"}
        unknown = given.keys() - set(FIELDS[tag])
        assert not unknown, f"{tag}: fields vLLM does not have: {unknown}"
    else:
        tag, form = event[0], "array"
        assert len(event) - 1 <= len(FIELDS[tag]), event
        given = dict(zip(FIELDS[tag], event[1:]))
    missing = set(REQUIRED[tag]) - given.keys()
    assert not missing, f"{tag} lacks {missing}"
    return tag, {name: given.get(name) for name in FIELDS[tag]}, form
