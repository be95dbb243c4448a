#!/usr/bin/env python3
"""Renders gpt-oss's chat template (tests/fixtures/templates/openai-gpt-oss-120b.jinja, from
llama.cpp's source tree) with Python's jinja2 as Hugging Face's apply_chat_template does
(trim_blocks, lstrip_blocks, `tojson`, `raise_exception`, `strftime_now` fixed to 2026-01-02),
for plain chat, tools, each reasoning effort and tool-call history, into
tests/fixtures/templates/gpt-oss-renders.jsonl: what sluice's minijinja rendering must equal
(sluice-tokenizer's tests/gpt_oss_template.rs). Needs jinja2 (the e2e venv has it).

    .venv/bin/python scripts/gpt-oss-template-fixture.py
"""
import json
import os

import jinja2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIR = os.path.join(ROOT, "tests", "fixtures", "templates")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
            },
            "required": ["city"],
        },
    },
}

CASES = [
    {"name": "plain", "messages": [{"role": "user", "content": "Hello!"}]},
    {
        "name": "system and turns",
        "messages": [
            {"role": "system", "content": "You answer in French."},
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "Quatre."},
            {"role": "user", "content": "And 3 + 3?"},
        ],
    },
    {"name": "effort high", "messages": [{"role": "user", "content": "Think hard."}],
     "kwargs": {"reasoning_effort": "high"}},
    {"name": "effort low", "messages": [{"role": "user", "content": "Quick."}],
     "kwargs": {"reasoning_effort": "low"}},
    {"name": "tools", "messages": [{"role": "user", "content": "Weather in Paris?"}],
     "tools": [WEATHER]},
    {
        "name": "tool history",
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        ],
        "tools": [WEATHER],
    },
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.FileSystemLoader(DIR))
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "2026-01-02"
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
    template = env.get_template("openai-gpt-oss-120b.jinja")
    with open(os.path.join(DIR, "gpt-oss-renders.jsonl"), "w") as f:
        for case in CASES:
            for gen in (True, False):
                text = template.render(
                    messages=case["messages"], tools=case.get("tools"), add_generation_prompt=gen,
                    bos_token="<|startoftext|>", eos_token="<|return|>", **case.get("kwargs", {}))
                row = dict(case, add_generation_prompt=gen, text=text)
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
