"""What a line reads after its conversation was rewritten (igi_sdk/runtime/prefix.py, pure)."""

from __future__ import annotations

from igi_sdk.runtime import prefix


def test_the_longest_common_token_prefix_is_kept() -> None:
    held = [1, 2, 3, 4, 5, 6]
    assert prefix.keep(held, [1, 2, 3, 9, 9]) == 3  # diverges at the 4th token
    assert prefix.keep(held, [1, 2, 3, 4, 5, 6, 7, 8]) == 6  # an extension: all kept
    assert prefix.keep(held, [7, 2, 3]) == 0  # nothing in common: all read
    assert prefix.keep([], [1, 2]) == 0  # a cache that was lost
    assert prefix.keep(held, []) == 0


def test_a_prompt_the_cache_holds_whole_reads_its_last_token_again() -> None:
    # the reply's first token is sampled from the logits of the last token read
    assert prefix.keep([1, 2, 3, 4], [1, 2, 3]) == 2
    assert prefix.keep([1, 2, 3], [1, 2, 3]) == 2
    assert prefix.keep([5], [5]) == 0


def test_a_rewrite_keeps_the_system_prompt_and_replaces_the_rest() -> None:
    msgs = [{"role": "system", "content": "You are Brom."},
            {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Welcome."}]
    out = prefix.rewritten(msgs, [("user", "Hi."), ("system", "Lydia joins."),
                                  ("assistant", "Well met.")])
    assert [m["role"] for m in out] == ["system", "user", "system", "assistant"]
    assert out[0]["content"] == "You are Brom." and out[2]["content"] == "Lydia joins."
    # a session opened without a system prompt: the history is the whole conversation
    assert prefix.rewritten(msgs[1:], [("user", "Yo.")]) == [{"role": "user", "content": "Yo."}]


def test_prefill_needs_a_rewrite_ending_with_an_assistant_turn_and_no_line() -> None:
    ends = [{"role": "user", "content": "Name?"}, {"role": "assistant", "content": "I am"}]
    assert prefix.is_prefill(ends, "", False, True)
    assert not prefix.is_prefill(ends, "", False, False)  # a session's own last reply: a line
    assert not prefix.is_prefill(ends, "More.", False, True)
    assert not prefix.is_prefill(ends, "", True, True)
    assert not prefix.is_prefill(ends[:1], "", False, True)


def test_the_last_message_is_rendered_open() -> None:
    parts = [("<|im_start|>user\n", True), ("Name?", False),
             ("<|im_end|>\n<|im_start|>assistant\n", True), ("I am", False),
             ("<|im_end|>\n", True)]
    assert prefix.open_last(parts, "I am") == parts[:4]
    assert prefix.open_last(parts, "  I am ") == parts[:4]  # as the template trimmed it
    assert prefix.open_last(parts, "Something else") is None  # a template that rewrote it
    assert prefix.open_last([("markup only", True)], "I am") is None
