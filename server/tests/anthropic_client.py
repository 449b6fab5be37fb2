#!/usr/bin/env python3
"""Check a running Strata server with the official `anthropic` client (pip install anthropic).

Usage: anthropic_client.py BASE_URL [--model NAME] [--no-tools]
  BASE_URL like http://127.0.0.1:8080 (a trailing /v1 is removed: the client adds it).
Exits non-zero on the first failed check. Works against the real engine and the fake one:
the shape of the answers is checked, not their text. What the model did with the tool is
printed, not judged (a 0.5B model need not pick the right tool).
"""
import argparse
import json
import sys

import anthropic


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# Sampling parameters go in the body: the client no longer has arguments for them (the API still
# reads them; so does this server).
GREEDY = {"extra_body": {"temperature": 0}}

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                     "required": ["city"]},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("--model", default="strata", help="model name to send (the server ignores it)")
    ap.add_argument("--no-tools", dest="tools", action="store_false",
                    help="skip the tool-call checks (for models whose template has no tools)")
    ap.add_argument("--api-key", default=None,
                    help="the server's API key: checks that a wrong one is refused (401), then uses it")
    ap.add_argument("--auth-only", action="store_true",
                    help="with --api-key: only the key checks and one request")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    if args.api_key is not None:
        wrong = anthropic.Anthropic(base_url=base, api_key=args.api_key + "-wrong", timeout=300, max_retries=0)
        try:
            wrong.messages.create(model="strata", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            check(False, "a wrong API key is refused")
        except anthropic.AuthenticationError as e:
            kind = (e.body or {}).get("error", {}).get("type")
            check(e.status_code == 401 and kind == "authentication_error",
                  f"a wrong API key (x-api-key) is refused: {e.status_code} {kind}")
    client = anthropic.Anthropic(base_url=base, api_key=args.api_key or "not-needed", timeout=300, max_retries=0)
    if args.auth_only:
        r = client.messages.create(model="strata", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        check(r is not None, "the right API key (x-api-key) is accepted")
        return
    model = args.model
    system = "You answer in one short sentence."
    messages = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": [{"type": "text", "text": "Write one short sentence about the sea."}]},
    ]

    m = client.messages.create(model=model, max_tokens=16, system=system, messages=messages, **GREEDY)
    check(m.type == "message" and m.role == "assistant", f"message: type {m.type}, role {m.role}")
    check(m.id.startswith("msg"), f"message: id {m.id}")
    check(len(m.content) >= 1 and m.content[0].type == "text", f"message: a text block ({m.content!r})")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"message: stop_reason {m.stop_reason}")
    check(m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 16, f"message: usage {m.usage}")
    text = m.content[0].text

    with client.messages.stream(model=model, max_tokens=16, system=system, messages=messages,
                                **GREEDY) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    check(kinds[0] == "message_start" and "message_stop" in kinds, f"stream: events {sorted(set(kinds))}")
    check(final.stop_reason == m.stop_reason, f"stream: stop_reason {final.stop_reason}")
    check(final.usage.output_tokens == m.usage.output_tokens, f"stream: usage {final.usage}")
    # temperature 0 is greedy: streaming and non-streaming must agree.
    check(final.content[0].text == text, f"stream text equals non-stream text ({text!r})")

    raw = list(client.messages.create(model=model, max_tokens=4, messages=messages, **GREEDY, stream=True))
    check([e.type for e in raw][-2:] == ["message_delta", "message_stop"], "raw stream ends with message_delta, message_stop")
    check(raw[-2].delta.stop_reason == "max_tokens" and raw[-2].usage.output_tokens == 4,
          f"raw stream: max_tokens 4 -> {raw[-2].delta.stop_reason}, {raw[-2].usage.output_tokens} tokens")

    # The answer's first word as a stop sequence: cut before it.
    words = text.split()
    if words:
        s = client.messages.create(model=model, max_tokens=16, system=system, messages=messages, **GREEDY,
                                   stop_sequences=[words[0]])
        check(s.stop_reason == "stop_sequence" and s.stop_sequence == words[0],
              f"stop_sequences: {s.stop_reason} {s.stop_sequence!r}")
        check(words[0] not in s.content[0].text, f"stop_sequences: text cut ({s.content[0].text!r})")

    n = client.messages.count_tokens(model=model, system=system, messages=messages)
    # Anthropic's usage splits the prompt: input_tokens computed, cache_read_input_tokens reused
    # from the engine's previous request (prompt reuse, docs/server.md).
    used = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    check(n.input_tokens == used, f"count_tokens: {n.input_tokens} vs usage {m.usage}")

    try:
        client.messages.create(model=model, max_tokens=16, messages=messages, extra_body={"temperature": 7})
        check(False, "temperature 7 is rejected")
    except anthropic.BadRequestError as e:
        check(e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error",
              f"bad parameter -> 400 invalid_request_error ({e.message})")

    if args.tools:
        tools(client, model)
    print("anthropic_client: all checks passed")


def tools(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    auto = client.messages.create(model=model, max_tokens=96, messages=ask, tools=[WEATHER_TOOL], **GREEDY)
    uses = [b for b in auto.content if b.type == "tool_use"]
    print(f"tools (auto): stop_reason {auto.stop_reason}, calls {[(u.name, u.input) for u in uses]}, "
          f"text {[b.text for b in auto.content if b.type == 'text']}")
    check(auto.stop_reason in ("tool_use", "end_turn", "max_tokens"), f"tools: stop_reason {auto.stop_reason}")
    check(all(isinstance(u.input, dict) and u.id.startswith("toolu") for u in uses), "tools: tool_use blocks")
    check((auto.stop_reason == "tool_use") == bool(uses), "tools: stop_reason tool_use iff calls")

    forced = client.messages.create(model=model, max_tokens=96, messages=ask, tools=[WEATHER_TOOL], **GREEDY,
                                    tool_choice={"type": "tool", "name": "get_weather"})
    use = next((b for b in forced.content if b.type == "tool_use"), None)
    print(f"tools (forced): {use.name if use else None} {use.input if use else forced.content!r}")
    check(forced.stop_reason == "tool_use" and use is not None and use.name == "get_weather"
          and isinstance(use.input, dict), "tools: a forced call is a tool_use block")

    # The result goes back as a tool_result block; the model answers (streaming).
    follow = ask + [{"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                  "content": json.dumps({"temperature_c": 18, "sky": "clear"})}]}]
    with client.messages.stream(model=model, max_tokens=48, messages=follow, tools=[WEATHER_TOOL],
                                **GREEDY) as stream:
        answer = stream.get_final_message()
    print(f"tools (after the result): {answer.stop_reason} {[getattr(b, 'text', b.type) for b in answer.content]}")
    check(answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content, "tools: answer after tool_result")


if __name__ == "__main__":
    main()
