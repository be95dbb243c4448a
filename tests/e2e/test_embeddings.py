"""`/v1/embeddings` through the official Python SDK (its default base64 and float) and LangChain's
`OpenAIEmbeddings`: unit vectors that batching does not change, `dimensions`, the errors, and a
mixed load of embeddings and generations in which every generation equals its run alone."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from langchain_openai import OpenAIEmbeddings

TEXTS = [
    "The cat sat on the mat.",
    "Paris is the capital of France.",
    "A recipe for tomato soup needs tomatoes, onions and stock, simmered for half an hour.",
    "x",
]


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def close(a: list[float], b: list[float], tol: float) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) <= tol


def test_default_base64_and_float_agree(client, model_name):
    # The SDK asks for base64 unless told otherwise, and decodes it.
    b64 = client.embeddings.create(model=model_name, input=TEXTS[0])
    flt = client.embeddings.create(model=model_name, input=TEXTS[0], encoding_format="float")
    assert b64.object == "list" and b64.model == model_name
    a, b = b64.data[0].embedding, flt.data[0].embedding
    assert len(a) == 576 and close(a, b, 1e-6)
    assert abs(norm(b) - 1) < 1e-5
    assert flt.usage.prompt_tokens == flt.usage.total_tokens > 0


def test_a_batch_changes_no_vector(client, model_name):
    alone = [
        client.embeddings.create(model=model_name, input=t, encoding_format="float").data[0].embedding
        for t in TEXTS
    ]
    batch = client.embeddings.create(model=model_name, input=TEXTS, encoding_format="float")
    assert [d.index for d in batch.data] == list(range(len(TEXTS)))
    for a, d in zip(alone, batch.data):
        assert close(a, d.embedding, 1e-4)
        assert abs(norm(d.embedding) - 1) < 1e-5
    assert alone[0] != alone[1]


def test_dimensions_truncate_and_renormalise(client, model_name):
    full = client.embeddings.create(model=model_name, input=TEXTS[1], encoding_format="float")
    short = client.embeddings.create(
        model=model_name, input=TEXTS[1], encoding_format="float", dimensions=64
    )
    v, w = full.data[0].embedding, short.data[0].embedding
    assert len(w) == 64 and abs(norm(w) - 1) < 1e-5
    scale = norm(v[:64])
    assert close([x / scale for x in v[:64]], w, 1e-5)


def test_langchain_openai_embeddings(server, client, model_name):
    lc = OpenAIEmbeddings(
        model=model_name,
        base_url=server.base_url,
        api_key="sk-not-checked",
        # Send the text itself (not tiktoken ids of OpenAI's vocabulary).
        check_embedding_ctx_length=False,
    )
    docs = lc.embed_documents(TEXTS[:3])
    query = lc.embed_query(TEXTS[1])
    direct = client.embeddings.create(model=model_name, input=TEXTS[:3], encoding_format="float")
    for a, d in zip(docs, direct.data):
        assert close(a, d.embedding, 1e-4)
    assert close(query, direct.data[1].embedding, 1e-4)


def test_errors_name_the_field(client, model_name):
    for kwargs, param in [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": "hi", "dimensions": 577}, "dimensions"),
        ({"input": "word " * 9000}, "input"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=model_name, encoding_format="float", **kwargs)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_name, input="word " * 9000)
    assert e.value.body["code"] == "context_length_exceeded"


def test_a_mixed_load_changes_no_generation(client, model_name):
    prompts = [f"Write one sentence about the number {i}." for i in range(8)]

    def generate(p: str) -> str:
        r = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": p}], max_tokens=24, temperature=0
        )
        return r.choices[0].message.content

    def embed(i: int) -> list[list[float]]:
        r = client.embeddings.create(
            model=model_name, input=[t * (i + 1) for t in TEXTS], encoding_format="float"
        )
        return [d.embedding for d in r.data]

    alone = [generate(p) for p in prompts]
    embeddings_alone = embed(3)
    with ThreadPoolExecutor(max_workers=16) as pool:
        gens = [pool.submit(generate, p) for p in prompts]
        embs = [pool.submit(embed, i) for i in range(8)]
        mixed = [g.result() for g in gens]
        vectors = [e.result() for e in embs]
    assert mixed == alone
    for a, b in zip(embeddings_alone, vectors[3]):
        assert close(a, b, 1e-4)
