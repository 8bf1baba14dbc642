"""Reading sglang's replies: plain data in, the gateway's records or errors out. The client that
fetches them is tested over real HTTP in test_engines.py."""

from typing import Any

import pytest

from gateway.engine_replies import (
    BODY_CUT,
    EngineAborted,
    EngineError,
    EngineRejected,
    ends_generation,
    error_message,
    read_engine_info,
    read_generation,
    read_piece,
)

URL = "http://engine"


def chunk(ids: list[int], completion_tokens: int, finish: Any = None) -> dict[str, Any]:
    """A stream chunk as sglang sends it: `ids` and a logprob of each."""
    pairs = [[-0.5, t, None] for t in ids]
    meta = {"finish_reason": finish, "completion_tokens": completion_tokens}
    return {"output_ids": ids, "meta_info": meta | {"output_token_logprobs": pairs}}


def test_a_generation_has_one_logprob_per_output_token() -> None:
    reply = chunk([5, 6], 2, finish={"type": "length", "length": 2})
    got = read_generation(reply, URL)
    assert got.output_ids == [5, 6] and got.logprobs == [-0.5, -0.5]
    assert got.finish_reason == "length" and got.replica == URL
    reply["meta_info"]["output_token_logprobs"][1][1] = 7
    with pytest.raises(EngineError, match="malformed /generate reply"):
        read_generation(reply, URL)
    with pytest.raises(EngineError, match="malformed"):
        read_generation(chunk([5], 1), URL)  # no finish reason


def test_whole_and_incremental_chunks_add_the_same_tokens() -> None:
    """sglang's default sends each chunk whole so far; `--incremental-streaming-output` only the
    new tokens. `completion_tokens` counts all so far either way."""
    whole = [chunk([1], 1), chunk([1, 2, 3], 3), chunk([1, 2, 3, 4], 4, finish="stop")]
    new = [chunk([1], 1), chunk([2, 3], 3), chunk([4], 4, finish="stop")]
    for chunks in (whole, new):
        seen = 0
        added = []
        for c in chunks:
            piece = read_piece(c, seen, URL)
            seen += len(piece.output_ids)
            added.append(piece.output_ids)
        assert added == [[1], [2, 3], [4]] and piece.finish_reason == "stop"
    assert [ends_generation(c) for c in whole] == [False, False, True]


def test_an_abort_is_a_refusal_with_status_400_else_a_generation_given_up() -> None:
    refused = {"type": "abort", "message": "too long", "status_code": 400}
    with pytest.raises(EngineRejected, match="too long"):
        read_piece(chunk([9], 1, finish=refused), 0, URL)
    given_up = {"type": "abort", "message": "weights update"}
    with pytest.raises(EngineAborted, match="weights update"):
        read_generation(chunk([9], 1, finish=given_up), URL)
    # an abort from the waiting queue carries only the last id: the abort is read first
    with pytest.raises(EngineAborted):
        read_piece(chunk([9], 5, finish=given_up), 0, URL)
    with pytest.raises(EngineRejected, match="mid-stream: out of memory"):
        read_piece({"error": {"message": "out of memory"}}, 0, URL)
    assert ends_generation({"error": "x"})


def test_an_error_body_s_message_is_found_and_cut() -> None:
    assert error_message('{"error": {"message": "bad"}}', "Bad Request") == "bad"
    assert error_message('{"message": "worse"}', "Bad Request") == "worse"
    assert error_message("", "Bad Request") == "Bad Request"
    assert len(error_message("x" * 10_000, "")) == BODY_CUT


def test_what_the_engine_says_of_itself() -> None:
    models = {"data": [{"id": "/m", "owned_by": "sglang", "max_model_len": 4096}]}
    info = read_engine_info({"model_path": "/m"}, models, pool_tokens=None)
    assert info.tokenizer_path == "/m" and info.context_length == 4096
    assert info.weight_version == "None" and info.owned_by == "sglang"
    with pytest.raises(EngineError, match="malformed /model_info"):
        read_engine_info({"model_path": "/m"}, {"data": []}, pool_tokens=None)
