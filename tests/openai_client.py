"""The official `openai` Python package against a running `rustle serve`.

Usage: python openai_client.py BASE_URL API_KEY MODEL TOOLS_BASE TOOLS_MODEL
Run by the Rust test `openai_python_client` (tests/server.rs) in a fresh virtual environment
with `openai` and `jsonschema`. TOOLS_BASE serves a model whose chat template renders tools.
"""

import json
import sys

import jsonschema
import openai
from openai import OpenAI

base, key, model, tools_base, tools_model = sys.argv[1:6]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)

# models.list()
ids = [m.id for m in client.models.list().data]
assert ids == [model], ids

# A streaming chat completion, with the usage chunk at the end.
question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
stream = client.chat.completions.create(
    model=model,
    messages=question,
    max_tokens=16,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, roles = "", None, None, set()
for chunk in stream:
    assert chunk.object == "chat.completion.chunk", chunk
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.role:
            roles.add(choice.delta.role)
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert "Paris" in text, text
assert roles == {"assistant"}, roles
assert finish in ("stop", "length"), finish
assert usage is not None and usage.completion_tokens > 0, usage
assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

# The same question without streaming: the same text (greedy).
reply = client.chat.completions.create(model=model, messages=question, max_tokens=16, temperature=0)
assert reply.choices[0].message.content == text, (reply, text)
assert reply.choices[0].message.role == "assistant"

# A non-streaming text completion with log-probabilities.
done = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2
)
choice = done.choices[0]
assert done.object == "text_completion", done
assert choice.text.strip(), done
assert choice.finish_reason in ("stop", "length"), done
assert len(choice.logprobs.tokens) == done.usage.completion_tokens, done
assert all(len(top) == 2 for top in choice.logprobs.top_logprobs), done

# Errors reach the client as its own exception types.
try:
    client.chat.completions.create(model="no-such-model", messages=question, max_tokens=4)
    raise AssertionError("an unknown model was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.code == "model_not_found", e.body
try:
    # The default model's template does not render tools: it would never hear of them.
    client.chat.completions.create(
        model=model, messages=question, tools=[{"type": "function", "function": {"name": "f"}}]
    )
    raise AssertionError("tools were accepted by a model whose template has none")
except openai.BadRequestError as e:
    assert e.param == "tools", e.body
try:
    OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e.body


# Structured output: every reply to a json_schema request validates against its schema.
name = {"type": "string", "minLength": 1, "maxLength": 24}
SCHEMAS = [
    {"type": "object", "properties": {"capital": name}, "required": ["capital"],
     "additionalProperties": False},
    {"type": "object", "properties": {"city": name, "population": {"type": "integer", "minimum": 0,
     "maximum": 99999999}}, "required": ["city", "population"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"type": "boolean"}, "reason": name},
     "required": ["answer", "reason"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": name, "minItems": 1,
     "maxItems": 3}}, "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"mood": {"enum": ["happy", "sad", "neutral"]}},
     "required": ["mood"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {"first": name,
     "last": name, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
     "required": ["first", "last", "age"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -100,
     "maximum": 100}, "unit": {"enum": ["C", "F"]}}, "required": ["temperature", "unit"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 3,
     "maxItems": 3},
    {"type": "object", "properties": {"title": name, "tags": {"type": "array", "items":
     {"enum": ["news", "sport", "science"]}, "maxItems": 2}, "draft": {"type": "boolean"}},
     "required": ["title", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0,
     "maximum": 1000}, {"type": "null"}]}}, "required": ["value"], "additionalProperties": False},
]
PROMPTS = [
    "What is the capital of France?",
    "Name a large city and its population.",
    "Is the sky blue? Say why.",
    "List some colors.",
    "How do you feel today?",
    "Invent a person.",
    "What is the temperature outside?",
    "Give three digits.",
    "Write a headline about science.",
    "Pick a number.",
]
for i, (schema, prompt) in enumerate(zip(SCHEMAS, PROMPTS)):
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt + " Answer in JSON."}],
        max_tokens=200,
        temperature=0 if i % 2 == 0 else 0.8,
        seed=i,
        response_format={"type": "json_schema",
                         "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
    )
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", (i, reply)
    jsonschema.validate(json.loads(text), schema)

# json_object, streamed: the text put together is one JSON object.
stream = client.chat.completions.create(
    model=model, messages=question, max_tokens=200, temperature=0, stream=True,
    response_format={"type": "json_object"},
)
text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
assert isinstance(json.loads(text), dict), text

# Tool calls, from a model whose template renders tools: with `required` and with a named
# function, the calls parse and their arguments validate against the function's schema.
tools_client = OpenAI(base_url=tools_base + "/v1", api_key="none", max_retries=0)
weather = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}
tools = [
    {"type": "function", "function": {"name": "get_weather", "description": "A forecast",
                                      "parameters": weather}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
     "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}},
]
weather_q = [{"role": "user", "content": "What will the weather be in Oslo?"}]
reply = tools_client.chat.completions.create(
    model=tools_model, messages=weather_q, tools=tools, tool_choice="required", max_tokens=200,
    seed=3,  # a random model's sampled calls may run past 200 tokens: this draw ends
)
choice = reply.choices[0]
assert choice.finish_reason == "tool_calls", reply
assert choice.message.tool_calls, reply
for call in choice.message.tool_calls:
    params = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == call.function.name)
    jsonschema.validate(json.loads(call.function.arguments), params)
    assert call.type == "function" and call.id.startswith("call_"), call

stream = tools_client.chat.completions.create(
    model=tools_model, messages=weather_q, tools=tools, max_tokens=200, stream=True, seed=3,
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
)
calls, finish = {}, None
for chunk in stream:
    for c in chunk.choices:
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
assert calls[0]["name"] == "get_weather", calls
jsonschema.validate(json.loads(calls[0]["arguments"]), weather)

# The call and its result sent back: the template renders them, and the model answers.
follow = weather_q + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
]
reply = tools_client.chat.completions.create(
    model=tools_model, messages=follow, tools=tools, tool_choice="none", max_tokens=8,
)
assert reply.choices[0].finish_reason in ("stop", "length"), reply

print("openai client: all checks passed")
