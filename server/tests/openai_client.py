#!/usr/bin/env python3
"""Check a running Strata server with the official `openai` client (pip install openai).

Usage: openai_client.py BASE_URL [--model NAME] [--no-tools]
  BASE_URL like http://127.0.0.1:8080/v1 (a trailing /v1 is added if missing).
Exits non-zero on the first failed check. Works against the real engine and the fake one:
only the shape of the answers is checked, not their text. What the model did with the tool is
printed, not judged (a 0.5B model need not pick the right tool).
"""
import argparse
import json
import sys

import openai


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("--model", default=None, help="model name to send (default: first of /v1/models)")
    ap.add_argument("--no-tools", dest="tools", action="store_false",
                    help="skip the tool-call checks (for models whose template has no tools)")
    ap.add_argument("--api-key", default=None,
                    help="the server's API key: checks that a wrong one is refused (401), then uses it")
    ap.add_argument("--auth-only", action="store_true",
                    help="with --api-key: only the key checks and one request")
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    if args.api_key is not None:
        wrong = openai.OpenAI(base_url=base, api_key=args.api_key + "-wrong", timeout=300, max_retries=0)
        try:
            wrong.chat.completions.create(model="strata", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            check(False, "a wrong API key is refused")
        except openai.AuthenticationError as e:
            check(e.status_code == 401 and e.code == "invalid_api_key",
                  f"a wrong API key (Authorization: Bearer) is refused: {e.status_code} {e.code}")
    client = openai.OpenAI(base_url=base, api_key=args.api_key or "not-needed", timeout=300, max_retries=0)
    if args.auth_only:
        r = client.chat.completions.create(model="strata", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        check(r is not None, "the right API key (Authorization: Bearer) is accepted")
        return

    models = client.models.list().data
    check(len(models) >= 1, f"/v1/models lists a model ({[m.id for m in models]})")
    model = args.model or models[0].id
    messages = [{"role": "user", "content": "Write one short sentence about the sea."}]

    r = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0, seed=1)
    c = r.choices[0]
    check(c.message.role == "assistant", "chat: role is assistant")
    check(isinstance(c.message.content, str), f"chat: content is text ({c.message.content!r})")
    check(c.finish_reason in ("stop", "length"), f"chat: finish_reason {c.finish_reason}")
    check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens <= 16, f"chat: usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "chat: total_tokens")

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=16, temperature=0, seed=1, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, n = "", None, None, 0
    for chunk in stream:
        n += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    check(n >= 2, f"chat stream: {n} chunks")
    check(finish in ("stop", "length"), f"chat stream: finish_reason {finish}")
    check(usage is not None and usage.completion_tokens <= 16, f"chat stream: usage {usage}")
    # temperature 0 is greedy: streaming and non-streaming must agree.
    check(text == c.message.content, f"chat stream text equals non-stream text ({text!r})")

    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    check(isinstance(r.choices[0].text, str), f"completion: text {r.choices[0].text!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), f"completion: finish_reason {r.choices[0].finish_reason}")
    check(r.usage.completion_tokens <= 8, f"completion: usage {r.usage}")

    parts = []
    for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8,
                                           temperature=0, stream=True):
        parts.append(chunk.choices[0].text if chunk.choices else "")
    check("".join(parts) == r.choices[0].text, f"completion stream text equals non-stream text ({''.join(parts)!r})")

    try:
        client.chat.completions.create(model=model, messages=messages, temperature=7)
        check(False, "temperature 7 is rejected")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"bad parameter -> 400 ({e.message})")

    if args.tools:
        tools(client, model)
    print("openai_client: all checks passed")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}


def tools(client, model):
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    r = client.chat.completions.create(model=model, messages=ask, tools=[WEATHER_TOOL], max_tokens=96, temperature=0)
    c = r.choices[0]
    calls = c.message.tool_calls or []
    print(f"tools (auto): finish_reason {c.finish_reason}, calls "
          f"{[(t.function.name, t.function.arguments) for t in calls]}, content {c.message.content!r}")
    check(c.finish_reason in ("tool_calls", "stop", "length"), f"tools: finish_reason {c.finish_reason}")
    check((c.finish_reason == "tool_calls") == bool(calls), "tools: finish_reason tool_calls iff calls")
    check(all(isinstance(json.loads(t.function.arguments), dict) and t.type == "function" for t in calls),
          "tools: arguments are JSON objects")

    stream = client.chat.completions.create(model=model, messages=ask, tools=[WEATHER_TOOL], max_tokens=96,
                                            temperature=0, stream=True, tool_choice="required")
    name, arguments, call_id, finish = "", "", None, None
    for chunk in stream:
        for ch in chunk.choices:
            for t in ch.delta.tool_calls or []:
                call_id = t.id or call_id
                name += t.function.name or ""
                arguments += t.function.arguments or ""
            finish = ch.finish_reason or finish
    print(f"tools (required, streamed): {name} {arguments}")
    check(finish == "tool_calls" and name == "get_weather" and isinstance(json.loads(arguments), dict),
          "tools: a required call streams as tool_calls")

    follow = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temperature_c": 18, "sky": "clear"})}]
    r = client.chat.completions.create(model=model, messages=follow, tools=[WEATHER_TOOL], max_tokens=48, temperature=0)
    print(f"tools (after the result): {r.choices[0].finish_reason} {r.choices[0].message.content!r}")
    check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), "tools: answer after the tool result")


if __name__ == "__main__":
    main()
