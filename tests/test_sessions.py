"""reef.sessions: what counts as the same conversation."""

from __future__ import annotations

from reef.sessions import (
    answer_message,
    candidate_hashes,
    normalize,
    record_state_hash,
    state_hash,
)

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Say hello."}
ANSWER = {"role": "assistant", "content": "Hello!"}


def _completion(message: dict) -> dict:
    return {"id": "c1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def test_list_of_text_parts_equals_string_content() -> None:
    parts = {
        "role": "user",
        "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}],
    }
    assert normalize([parts]) == normalize([USER]) == [{"role": "user", "content": "Say hello."}]
    assert state_hash([SYSTEM, parts]) == state_hash([SYSTEM, USER])


def test_non_text_parts_are_kept() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    msg = {"role": "user", "content": [{"type": "text", "text": "What is it?"}, image]}
    assert normalize([msg])[0]["content"] == ["What is it?", image]
    assert state_hash([msg]) != state_hash([{"role": "user", "content": "What is it?"}])


def test_developer_counts_as_system() -> None:
    developer = {"role": "developer", "content": "Be brief."}
    assert normalize([developer]) == normalize([SYSTEM])
    assert state_hash([developer, USER]) == state_hash([SYSTEM, USER])


def test_empty_fields_are_dropped() -> None:
    sdk_echo = {
        "role": "assistant",
        "content": "Hello!",
        "refusal": None,
        "tool_calls": None,
        "function_call": None,
        "audio": None,
        "name": "",
    }
    assert normalize([sdk_echo]) == [ANSWER]


def test_tool_calls_normalize_arguments_and_keep_ids() -> None:
    engine = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"b": 2, "a": 1}'},
            }
        ],
    }
    resent = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"a":1,"b":2}'},
            }
        ],
    }
    assert normalize([engine]) == normalize([resent])
    assert normalize([engine])[0] == {
        "role": "assistant",
        "tool_calls": [{"id": "call_1", "name": "lookup", "arguments": '{"a":1,"b":2}'}],
    }
    result = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    other = {**result, "tool_call_id": "call_2"}
    assert state_hash([USER, engine, result]) != state_hash([USER, engine, other])


def test_record_state_hash_is_what_the_next_request_starts_with() -> None:
    h = record_state_hash([SYSTEM, USER], _completion(ANSWER))
    assert h == state_hash([SYSTEM, USER, ANSWER])
    follow_up = [SYSTEM, USER, ANSWER, {"role": "user", "content": "And goodbye?"}]
    assert candidate_hashes(follow_up) == [h]


def test_an_answer_with_tool_calls_is_continued_by_its_tool_results() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    h = record_state_hash([USER], _completion({"role": "assistant", "tool_calls": [call]}))
    sent_back = {"role": "assistant", "content": None, "tool_calls": [call]}
    follow_up = [USER, sent_back, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    assert candidate_hashes(follow_up) == [h]
    other = {**call, "function": {**call["function"], "name": "get_time"}}
    assert record_state_hash([USER], _completion({"role": "assistant", "tool_calls": [other]})) != h


def test_different_answers_hash_differently() -> None:
    a = record_state_hash([USER], _completion(ANSWER))
    b = record_state_hash([USER], _completion({"role": "assistant", "content": "Hi!"}))
    assert a != b


def test_candidate_hashes_are_longest_first() -> None:
    u2 = {"role": "user", "content": "More."}
    a2 = {"role": "assistant", "content": "Sure."}
    u3 = {"role": "user", "content": "Even more."}
    messages = [SYSTEM, USER, ANSWER, u2, a2, u3]
    assert candidate_hashes(messages) == [
        state_hash([SYSTEM, USER, ANSWER, u2, a2]),
        state_hash([SYSTEM, USER, ANSWER]),
    ]
    # An assistant message that ends the request is a prefill, not a state to continue.
    assert candidate_hashes([SYSTEM, USER, ANSWER]) == []
    assert candidate_hashes([SYSTEM, USER]) == []


def test_answer_message_of_a_completion() -> None:
    assert answer_message(_completion(ANSWER)) == ANSWER
    assert answer_message({"choices": []}) == {"role": "assistant"}
