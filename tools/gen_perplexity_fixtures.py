#!/usr/bin/env python3
"""llama.cpp's perplexities for tests/e2e/test_perplexity.py.

Runs llama-perplexity (built from the llama-cpp-python source package's
vendor/llama.cpp: cmake --build build --target llama-perplexity) on the GPL-3
text every Debian system has, for stories260K and the default model, and
writes tests/fixtures/perplexity/llamacpp.json.

  tools/gen_perplexity_fixtures.py --llama-perplexity PATH/llama-perplexity
"""
import argparse
import json
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEXT = "/usr/share/common-licenses/GPL-3"
CASES = [
    {"name": "stories260K", "model": str(REPO.parent / "shared/data/models/stories260K.gguf"), "ctx": 128},
    {"name": "gemma3-270m-q4_k_m", "model": None, "ctx": 512},
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-perplexity", required=True)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    out = []
    for case in CASES:
        model = case["model"] or (REPO / "build" / "default-model.txt").read_text().strip()
        p = subprocess.run([args.llama_perplexity, "-m", model, "-f", TEXT, "-c", str(case["ctx"]),
                            "-t", str(args.threads)], capture_output=True, text=True, check=True)
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout + p.stderr)
        out.append({"name": case["name"], "text": TEXT, "ctx": case["ctx"], "ppl": float(m.group(1)),
                    "ppl_stderr": float(m.group(2))})
        print(out[-1])
    path = REPO / "tests/fixtures/perplexity/llamacpp.json"
    path.write_text(json.dumps({"generator": "tools/gen_perplexity_fixtures.py (llama.cpp llama-perplexity)",
                                "cases": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
