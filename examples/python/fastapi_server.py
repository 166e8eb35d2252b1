"""A /generate endpoint on AsyncLLM, the shape of vLLM's api_server example.
Run: PAGELLM_MODEL=model.gguf uvicorn fastapi_server:app  (no PAGELLM_MODEL: the default model)
POST {"prompt": "...", "stream": false, ...SamplingParams fields} -> {"text": [...]}"""
import json
import os
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pagellm import AsyncLLM, SamplingParams

engine = AsyncLLM(model=os.environ.get("PAGELLM_MODEL"))
app = FastAPI()


@app.post("/generate")
async def generate(request: Request):
    body = await request.json()
    prompt, stream = body.pop("prompt"), body.pop("stream", False)
    try:
        results = engine.generate(prompt, SamplingParams(**body), uuid.uuid4().hex)
        first = await anext(results)  # bad parameters fail here, before any reply
    except (TypeError, ValueError) as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    if stream:
        async def lines():
            out = first
            while out is not None:
                yield json.dumps({"text": [o.text for o in out.outputs]}) + "\n"
                out = await anext(results, None)
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    final = first
    async for final in results:
        pass
    return {"text": [o.text for o in final.outputs]}
