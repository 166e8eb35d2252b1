"""Offline batched generation with pagellm's vLLM-style API (the README's example).
Run: .venv/bin/python examples/python/offline.py [MODEL]  (no MODEL: the default, Gemma 3 270M)"""
import sys

from pagellm import LLM, SamplingParams

llm = LLM(model=sys.argv[1] if len(sys.argv) > 1 else None, max_model_len=1024)
prompts = ["The capital of France is", "The three primary colors are"]
for out in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24)):
    print(f"{out.prompt!r} -> {out.outputs[0].text!r}")

# The default model is pretrained, not instruction-tuned: one example exchange shows it the way.
conversation = [{"role": "user", "content": "What is the capital of Germany?"},
                {"role": "assistant", "content": "Berlin."},
                {"role": "user", "content": "What is the capital of France?"}]
chat = llm.chat(conversation, SamplingParams(temperature=0, max_tokens=8, stop=["."]))
print("chat ->", repr(chat[0].outputs[0].text))
