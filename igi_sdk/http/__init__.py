"""The sidecar's OpenAI-compatible HTTP face (``igi-sdk serve --http``): Chat Completions for the
mods and tools that speak it, over the sidecar's own protocol inward, so every rule (caps,
priorities, pacing, typed errors, ownership) lives in one place."""
