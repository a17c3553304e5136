"""The official `openai` Python package against a running `rustle serve`.

Usage: python openai_client.py BASE_URL API_KEY MODEL
Run by the Rust test `openai_python_client` (tests/server.rs) in a fresh virtual environment.
"""

import sys

import openai
from openai import OpenAI

base, key, model = sys.argv[1:4]
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
    client.chat.completions.create(
        model=model, messages=question, tools=[{"type": "function", "function": {"name": "f"}}]
    )
    raise AssertionError("tools were accepted")
except openai.BadRequestError as e:
    assert e.param == "tools", e.body
try:
    OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    raise AssertionError("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401, e.body

print("openai client: all checks passed")
