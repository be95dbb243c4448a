"""Schemathesis hooks for test_openapi.py (loaded through SCHEMATHESIS_HOOKS): generated
requests mostly name the served model. Any other model id is a 404 by design, and random ids
would keep most requests from ever reaching validation and generation; one in eight keeps its
generated id so the 404 path stays covered."""

from __future__ import annotations

import json
import os
import zlib

import schemathesis

MODEL = os.environ["E2E_SERVED_MODEL"]


def _keep_generated(value: object) -> bool:
    # Deterministic (not `random`), so a run is reproducible from its seed.
    digest = zlib.crc32(json.dumps(value, sort_keys=True, default=str).encode())
    return digest % 8 == 0


@schemathesis.hook
def map_body(ctx, body):
    if isinstance(body, dict) and isinstance(body.get("model"), str) and not _keep_generated(body):
        body["model"] = MODEL
    return body


@schemathesis.hook
def map_path_parameters(ctx, parameters):
    if parameters and "model" in parameters and not _keep_generated(parameters):
        parameters["model"] = MODEL
    return parameters
