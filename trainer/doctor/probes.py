"""What the doctor sends one engine, as the gateway sends it: a chat prompt, `/generate`, a stream.

- Owns the prompt and sampling of the checks' requests, and the HTTP calls of checks 4 to 7 on
  one engine URL: a GET's JSON, one `/generate`, a stream read to its end, aborted by its rid, or
  left without an abort. An answer other than a 200 fails the check with its fix.
- Holds no state and knows no config: `checkup.Doctor` passes the HTTP client, the URL and the
  body; judging a reply is `replies`'s.
"""

import json
from typing import Any

import httpx

from trainer.doctor.replies import MalformedReply, Sampled, parse_generation, parse_stream
from trainer.doctor.report import FIXES, CheckFailed
from trainer.engines import wait_idle

PROMPT = [{"role": "user", "content": "Say hello in three words."}]
SAMPLING = {"max_new_tokens": 16, "temperature": 1.0, "top_k": -1, "top_p": 1.0}
STREAMED = {"max_new_tokens": 20, "temperature": 1.0, "ignore_eos": True}
LONG_TOKENS = 4096  # a stream that outlasts sglang's 2 s before it aborts a gone client
LEFT_AFTER = 5  # chunks a harness reads before it leaves (the H200's crash)


def prompt_ids(tokenizer: Any) -> list[int]:
    """A short chat prompt as the gateway sends one: the chat template's text, tokenized."""
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def streamed(prompt: list[int], max_new_tokens: int, rid: str) -> dict[str, Any]:
    """A streamed `/generate` body of the doctor's prompt, named `rid`."""
    sampling = {**STREAMED, "max_new_tokens": max_new_tokens}
    return {
        "input_ids": prompt,
        "sampling_params": sampling,
        "return_logprob": True,
        "stream": True,
        "rid": rid,
    }


def fail_unless_ok(reply: httpx.Response, where: str, check: str) -> None:
    """An answer other than a 200 fails `check`, naming `where`, the status and the reply's start."""
    if reply.status_code != 200:
        reply.read()  # a stream's body is not read yet
        raise CheckFailed(f"{where}: {reply.status_code} {reply.text[:200]}", FIXES[check])


def get_json(http: httpx.Client, url: str, route: str, check: str) -> Any:
    """A GET's JSON; an answer other than a 200 fails `check`."""
    reply = http.get(url.rstrip("/") + route)
    fail_unless_ok(reply, f"{url}{route}", check)
    return reply.json()


def generate_one(http: httpx.Client, url: str, body: dict[str, Any]) -> Sampled:
    """One engine's `/generate` reply, as the gateway would record it."""
    reply = http.post(url + "/generate", json=body)
    fail_unless_ok(reply, f"{url}/generate", "generate")
    try:
        return parse_generation(reply.json())
    except MalformedReply as e:
        fix = (
            "The engine must answer as sglang 0.5.13 does, one [logprob, id] per output token: "
            "check that the sglang installed is the pinned one (check 1), and its log."
        )
        raise CheckFailed(f"{url}/generate: {e}", fix) from e


def read_stream(
    http: httpx.Client, url: str, body: dict[str, Any], abort_after: int | None = None
) -> list[Any]:
    """A streamed `/generate`'s chunks, read to `[DONE]`; after `abort_after` chunks,
    `/abort_request` names its rid (the stream still read to its end)."""
    chunks: list[Any] = []
    with http.stream("POST", url + "/generate", json=body) as reply:
        fail_unless_ok(reply, f"{url}/generate", "stream")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks.append(json.loads(line.removeprefix("data: ")))
            if len(chunks) == abort_after:
                http.post(url + "/abort_request", json={"rid": body["rid"]})
    return chunks


def abort_one(http: httpx.Client, url: str, body: dict[str, Any]) -> None:
    """The long stream `body` on `url`, aborted by its rid after its first chunk and read to its
    end: its last chunk says it was aborted, and the engine runs nothing after it."""
    chunks = read_stream(http, url, body, abort_after=1)
    _, finish = parse_stream(chunks)
    if finish != "abort":
        detail = f"{url}: a stream aborted by its rid ended with finish {finish!r}"
        raise CheckFailed(detail, FIXES["stream"])
    wait_idle(http, [url], timeout_s=5)


def leave(http: httpx.Client, url: str, body: dict[str, Any]) -> None:
    """The long stream `body` on `url`, left after `LEFT_AFTER` chunks, without an abort."""
    seen = 0
    with http.stream("POST", url + "/generate", json=body) as reply:
        for line in reply.iter_lines():
            seen += line.startswith("data: ")
            if seen == LEFT_AFTER:
                break
