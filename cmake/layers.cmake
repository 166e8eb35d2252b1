# The layers of src/, lowest first, and what each may include (docs/architecture.md).
# A layer may include itself and the layers listed for it, nothing else; the
# check below fails the build on an include that points the wrong way.
set(PAGELLM_LAYERS core backend model tokenizer chat kv scheduler runner sampling structured engine api server bench cli)
set(PAGELLM_LAYER_DEPS_core "")
set(PAGELLM_LAYER_DEPS_backend core)
set(PAGELLM_LAYER_DEPS_model backend core)
set(PAGELLM_LAYER_DEPS_tokenizer model core)
set(PAGELLM_LAYER_DEPS_chat core)
set(PAGELLM_LAYER_DEPS_kv core)
set(PAGELLM_LAYER_DEPS_scheduler kv core)
set(PAGELLM_LAYER_DEPS_runner model scheduler kv backend core)
set(PAGELLM_LAYER_DEPS_sampling core)
set(PAGELLM_LAYER_DEPS_structured sampling tokenizer core)
set(PAGELLM_LAYER_DEPS_engine runner structured sampling tokenizer scheduler kv model backend core)
set(PAGELLM_LAYER_DEPS_api engine structured sampling chat tokenizer core)
set(PAGELLM_LAYER_DEPS_server api engine sampling chat tokenizer core)
set(PAGELLM_LAYER_DEPS_bench engine tokenizer sampling core)
set(PAGELLM_LAYER_DEPS_cli bench server api engine structured sampling runner scheduler kv chat tokenizer model backend core)
