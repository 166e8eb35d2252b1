"""Structured outputs through the server: response_format (json_object,
json_schema), vLLM's structured_outputs and guided_* fields, on stories260K (a
story model: only the grammar makes it write JSON) and on Gemma 3 270M (the
README example, the openai client's parse() with a pydantic model). Bad
grammars are 400s naming the field, and leave other requests alone."""

import json
import re
import threading

import jsonschema
import pydantic
import pytest
import requests

from conftest import STORIES, Server, model_name, openai_client

# A chat template for stories260K, which ships none: the messages' text.
PLAIN_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


@pytest.fixture(scope="module")
def server():
    if not STORIES.exists():
        pytest.skip(f"missing {STORIES}")
    s = Server(["--max-num-seqs", "32", "--chat-template", PLAIN_TEMPLATE]).start()
    yield s
    assert s.stop() == 0, s.output()


def complete(server, **kw):
    # stories260K fills every gap the grammar allows with whitespace: room for it.
    body = {"model": model_name(server), "prompt": "Once upon a time", "max_tokens": 500, **kw}
    return requests.post(server.url("/v1/completions"), json=body, timeout=120)


SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "bird"]},
                                                     "age": {"type": "integer", "minimum": 0, "maximum": 30}},
                    "required": ["kind", "age"]},
        },
        "required": ["name", "pet"],
    },
    "array_bounds": {
        "type": "object",
        "properties": {"words": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                 "minItems": 2, "maxItems": 4}},
        "required": ["words"],
    },
    "enum_and_const": {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad", 3, None]}, "v": {"const": "one"}},
        "required": ["mood", "v"],
    },
    "pattern": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
        "required": ["code"],
    },
    "number_ranges": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "count": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
        },
        "required": ["score", "count"],
    },
    "optional": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"type": "string", "maxLength": 5}},
        "required": ["a"],
    },
    "defs_ref": {
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                                             "y": {"type": "integer", "minimum": -9, "maximum": 9}},
                            "required": ["x", "y"]}},
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
    },
    "array_of_objects": {
        "type": "array", "minItems": 1, "maxItems": 3,
        "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}},
                  "required": ["id"]},
    },
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_output_validates(server, name):
    schema = SCHEMAS[name]
    for seed in range(3):
        r = complete(server, temperature=0.9, seed=seed,
                     response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["text"]), schema)


def test_properties_come_in_schema_order(server):
    schema = {"type": "object", "properties": {"zeta": {"type": "integer", "minimum": 0, "maximum": 9},
                                               "alpha": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["zeta", "alpha"]}
    r = complete(server, temperature=0, guided_json=schema)
    text = r.json()["choices"][0]["text"]
    assert text.index('"zeta"') < text.index('"alpha"'), text


def test_json_object_and_vllm_fields(server):
    # Any object: stories260K may nest until max_tokens, so the text is (a prefix of) an object.
    r = complete(server, temperature=0, max_tokens=40, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"].lstrip().startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["text"]), dict)
    schema = SCHEMAS["nested"]
    for body in ({"structured_outputs": {"json": schema}}, {"guided_json": schema},
                 {"guided_json": json.dumps(schema), "guided_decoding_backend": "xgrammar"}):
        r = complete(server, temperature=0, **body)
        assert r.status_code == 200, (body, r.text)
        jsonschema.validate(json.loads(r.json()["choices"][0]["text"]), schema)


def test_regex_choice_and_grammar(server):
    pattern = r"(Lily|Tom) (saw|found) [0-9]{1,3} (cats|dogs)\."
    for body in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
        r = complete(server, temperature=0.8, seed=1, n=3, **body)
        assert r.status_code == 200, r.text
        for c in r.json()["choices"]:
            assert re.fullmatch(pattern, c["text"]), c["text"]
            assert c["finish_reason"] == "stop"
    choices = ["happy", "sad", "a \"quoted\" word"]
    for body in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        r = complete(server, temperature=1.0, seed=2, n=4, **body)
        assert r.status_code == 200, r.text
        assert all(c["text"] in choices for c in r.json()["choices"])
    gbnf = 'root ::= "The " animal " is " color "."\nanimal ::= "cat" | "dog"\ncolor ::= [a-z]{3,6}'
    for body in ({"structured_outputs": {"grammar": gbnf}}, {"guided_grammar": gbnf}):
        r = complete(server, temperature=0.5, seed=3, **body)
        assert r.status_code == 200, r.text
        assert re.fullmatch(r"The (cat|dog) is [a-z]{3,6}\.", r.json()["choices"][0]["text"])


def test_structural_tag(server):
    """xgrammar's structural tag: a tag around a sequence of a constant and a regex."""
    tag = {"type": "structural_tag",
           "format": {"type": "tag", "begin": "<answer>",
                      "content": {"type": "sequence", "elements": [
                          {"type": "const_string", "value": "code "},
                          {"type": "regex", "pattern": "[A-Z]{3}-[0-9]{2}"}]},
                      "end": "</answer>"}}
    r = complete(server, temperature=0, structured_outputs={"structural_tag": tag})
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"<answer>code [A-Z]{3}-[0-9]{2}</answer>", r.json()["choices"][0]["text"]), r.text


def test_streaming_and_stop_strings_and_max_tokens(server):
    schema = SCHEMAS["array_bounds"]
    with requests.post(server.url("/v1/completions"), stream=True, timeout=120,
                       json={"prompt": "Once", "max_tokens": 500, "temperature": 0, "stream": True,
                             "guided_json": schema}) as r:
        assert r.status_code == 200
        text = ""
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["text"]
    jsonschema.validate(json.loads(text), schema)
    # max_tokens still cuts (finish "length"), a stop string still stops.
    r = complete(server, temperature=0, max_tokens=3, guided_json=schema).json()["choices"][0]
    assert r["finish_reason"] == "length"
    r = complete(server, temperature=0, guided_json=schema, stop=[","]).json()["choices"][0]
    assert r["finish_reason"] == "stop" and "," not in r["text"]


class Pet(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    kind: str = pydantic.Field(pattern="^(cat|dog)$")
    age: int = pydantic.Field(ge=0, le=20)


def test_openai_parse_with_pydantic(server):
    client = openai_client(server)
    c = client.chat.completions.parse(model=model_name(server), response_format=Pet, max_tokens=500,
                                      temperature=0, messages=[{"role": "user", "content": "Once upon a time"}])
    pet = c.choices[0].message.parsed
    assert isinstance(pet, Pet), c
    assert c.choices[0].finish_reason == "stop"


def test_tools_required_elsewhere_bad_grammars_are_400(server):
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "{nope"}}},
         "response_format", "not JSON"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
         "response_format", "wat"),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json", "uniqueItems"),
        ({"guided_json": {"if": {"type": "string"}}}, "guided_json", "'if'"),
        ({"guided_regex": "([a-z"}, "guided_regex", "regex"),
        ({"guided_grammar": "root ::= nothing_defined"}, "guided_grammar", "grammar"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "only one"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "only one"),
        ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
        ({"structured_outputs": {"structural_tag": {"type": "bogus"}}}, "structured_outputs", "structural tag"),
    ]
    for body, param, words in cases:
        r = complete(server, **body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param, (body, err)
        assert words in err["message"], (body, err)


def test_bad_grammar_does_not_disturb_a_running_request(server):
    results = {}

    def good():
        results["good"] = complete(server, temperature=0, max_tokens=40, guided_regex="[a-z ]{10,30}\\.")

    t = threading.Thread(target=good)
    t.start()
    for _ in range(5):
        assert complete(server, guided_regex="((").status_code == 400
    t.join(120)
    r = results["good"]
    assert r.status_code == 200
    assert re.fullmatch("[a-z ]{10,30}\\.", r.json()["choices"][0]["text"])


def test_grammar_metrics_and_cache(server):
    pattern = "[0-9]{4}-[0-9]{2}"
    for _ in range(3):
        assert complete(server, temperature=0, guided_regex=pattern).status_code == 200
    metrics = requests.get(server.url("/metrics"), timeout=10).text
    assert re.search(r"^pagellm:structured_output_compile_requests_total\{[^}]*\} \d+", metrics, re.M), metrics
    hits = re.search(r"^pagellm:structured_output_cache_hits_total\{[^}]*\} (\d+)", metrics, re.M)
    assert hits and int(hits.group(1)) >= 2


@pytest.fixture(scope="module")
def gemma():
    from conftest import default_model_path
    model = default_model_path()
    if model is None:
        pytest.skip("the default model is not installed (make setup)")
    s = Server(["--max-model-len", "2048", "--kv-cache-memory", "128MiB"], model=model).start()
    yield s
    assert s.stop() == 0, s.output()


class City(pydantic.BaseModel):
    name: str
    country: str
    is_capital: bool


def test_gemma_readme_example(gemma):
    """The README's example: the real default model answers in the schema."""
    client = openai_client(gemma)
    c = client.chat.completions.parse(
        model=model_name(gemma), response_format=City, temperature=0, max_tokens=100,
        messages=[{"role": "user",
                   "content": "Describe Paris as JSON: its name, its country and whether it is the capital."}])
    city = c.choices[0].message.parsed
    assert isinstance(city, City)
    assert city.name == "Paris" and city.country == "France"
    simple = {"type": "object", "properties": {"answer": {"type": "string"}, "confident": {"type": "boolean"}},
              "required": ["answer", "confident"]}
    r = client.chat.completions.create(
        model=model_name(gemma), temperature=0, max_tokens=60,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": simple, "strict": True}})
    jsonschema.validate(json.loads(r.choices[0].message.content), simple)
    r = client.chat.completions.create(model=model_name(gemma), temperature=0, max_tokens=5,
                                       messages=[{"role": "user", "content": "Is Paris in France? Answer yes or no."}],
                                       extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert r.choices[0].message.content == "yes"
    # The README's tool call.
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    r = client.chat.completions.create(model=model_name(gemma), tools=[weather], tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=50, temperature=0,
                                       messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
