"""What SGLang and vLLM say about themselves (endpoints, metrics, start-up logs, check_env / collect-env)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from debugagent.tools.errors import ParseError
from debugagent.tools.serverinfo import (
    EffectiveConfig,
    diff_configs,
    effective_config,
    parse_check_env,
    parse_collect_env,
    parse_kwargs,
    parse_metrics,
    parse_repr,
    parse_sglang_model_info,
    parse_sglang_server_info,
    parse_startup_log,
    parse_vllm_version,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

V = Path(__file__).parent / "vectors" / "engines"


def text(name: str) -> str:
    return (V / name).read_text()


# ---------------------------------------------------------------- Python reprs
def test_server_args_repr_reads_into_a_dict():
    """`ServerArgs(…)` reads as a dict of its values: strings, numbers, None, booleans, lists."""
    v = parse_repr("ServerArgs(model_path='Qwen/Qwen3-8B', tp_size=2, attention_backend=None, mem_fraction_static=0.835, "
                   "disable_cuda_graph=False, cuda_graph_bs=[1, 2, 4], json_model_override_args='{}', hicache_ratio=2.0)")
    assert v == {"__type__": "ServerArgs", "model_path": "Qwen/Qwen3-8B", "tp_size": 2, "attention_backend": None,
                 "mem_fraction_static": 0.835, "disable_cuda_graph": False, "cuda_graph_bs": [1, 2, 4],
                 "json_model_override_args": "{}", "hicache_ratio": 2.0}


def test_vllm_kwargs_line_reads_bare_words_nested_calls_and_json():
    """vLLM's `with config:` line: bare words (`torch.bfloat16`, `cuda`), `Name(…)` calls and JSON objects."""
    v = parse_kwargs("model='m', dtype=torch.bfloat16, load_format=LoadFormat.AUTO, device_config=cuda:1, "
                     "decoding_config=DecodingConfig(backend='xgrammar'), compilation_config={\"level\":3,"
                     "\"use_cudagraph\":true,\"cudagraph_capture_sizes\":[4,2,1]}, seed=0")
    assert v["dtype"] == "torch.bfloat16" and v["load_format"] == "LoadFormat.AUTO" and v["device_config"] == "cuda:1"
    assert v["decoding_config"] == {"__type__": "DecodingConfig", "backend": "xgrammar"}
    assert v["compilation_config"]["use_cudagraph"] is True and v["compilation_config"]["cudagraph_capture_sizes"] == [4, 2, 1]
    assert v["seed"] == 0


def test_a_cut_kwargs_line_keeps_what_was_read():
    """A log line cut in the middle of a value keeps the fields before the cut."""
    v = parse_kwargs("model='m', tensor_parallel_size=2, compilation_config={\"level\":3,\"cudagraph_capt")
    assert v == {"model": "m", "tensor_parallel_size": 2}


# ---------------------------------------------------------------- SGLang endpoints
def test_sglang_server_info_separates_arguments_from_what_the_scheduler_runs():
    """`/server_info`: the arguments at the top, the scheduler's resolved view in `internal_states[0]`."""
    si = parse_sglang_server_info(text("sglang_get_server_info.json"))
    assert si.version == "0.5.6" and si.max_total_num_tokens == 712440 and si.role is None
    assert si.args["decode_attention_backend"] is None and si.internal["decode_attention_backend"] == "fa3"
    assert si.internal["memory_usage"]["token_capacity"] == 712440 and "internal_states" not in si.args


def test_sglang_pd_router_answer_reads_the_decode_server():
    """A PD-disaggregated answer (`prefill`, `decode` lists) is read from the decode server, spec accept length too."""
    si = parse_sglang_server_info(text("sglang_server_info_pd.json"))
    cfg = effective_config(server_info=si)
    assert si.role == "decode" and cfg.speculative_algorithm == "EAGLE3" and cfg.avg_spec_accept_length == 2.81
    assert cfg.attention_backend == "flashinfer" and cfg.kv_cache_tokens == 690112


def test_sglang_model_info():
    """`/model_info` names the model, its architectures and whether it generates."""
    mi = parse_sglang_model_info(text("sglang_model_info.json"))
    assert (mi.model_path, mi.is_generation, mi.architectures, mi.model_type) == \
        ("Qwen/Qwen3-8B", True, ["Qwen3ForCausalLM"], "qwen3")


@pytest.mark.parametrize("body,match", [("<html><body>404 Not Found</body></html>", "an HTML page"),
                                        ("[1, 2]", "not an object"), ("", "not JSON")])
def test_endpoint_answers_that_are_not_json_objects_are_parse_errors(body, match):
    """An HTML error page or a JSON list is a ParseError naming what it was."""
    with pytest.raises(ParseError, match=match):
        parse_sglang_server_info(body)


def test_a_server_that_answers_every_path_with_one_object_is_not_sglang():
    """The H200 lab's server answers any GET with `{"ok": true}`: read as SGLang's server info it made the server
    "engine sglang". An answer with none of SGLang's keys is a ParseError, and no engine is inferred from it."""
    with pytest.raises(ParseError, match="not SGLang's server info"):
        parse_sglang_server_info('{"ok": true}')
    assert effective_config(server_info=None).engine is None
    body = json.loads(text("sglang_get_server_info.json"))
    assert parse_sglang_server_info(json.dumps({"model_path": body["model_path"]})).args["model_path"]


def test_vllm_version():
    """vLLM `/version` is `{"version": …}`."""
    assert parse_vllm_version(text("vllm_version.json")) == "0.11.0"
    with pytest.raises(ParseError, match="no `version`"):
        parse_vllm_version('{"v": 1}')


# ---------------------------------------------------------------- /metrics
def test_vllm_metrics_and_cache_config_labels():
    """Prometheus text: samples with labels; `vllm:cache_config_info` keeps its values in its labels."""
    m = parse_metrics(text("vllm_metrics.txt"))
    assert m.get("vllm:num_requests_running", model_name="Qwen/Qwen3-8B") == 16.0
    assert m.get("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 200.0
    labels = m.labels_of("vllm:cache_config_info")
    assert labels["num_gpu_blocks"] == "45338" and labels["block_size"] == "16" and labels["cache_dtype"] == "auto"
    cfg = effective_config(metrics=m)
    assert cfg.engine == "vllm" and cfg.kv_cache_tokens == 45338 * 16 and cfg.sources["kv_cache_tokens"].startswith("metrics")


def test_sglang_metrics():
    """`sglang:` names read the same way; `max_total_num_tokens` is the KV cache size."""
    m = parse_metrics(text("sglang_metrics.txt"))
    assert m.get("sglang:gen_throughput") == 1187.42
    assert effective_config(metrics=m).kv_cache_tokens == 712440


def test_metrics_labels_with_escapes_and_odd_values():
    """Escaped quotes in label values, timestamps and `+Inf`/`NaN` values are read."""
    m = parse_metrics('x{a="say \\"hi\\"",b="c,d"} +Inf 1700000000\ny NaN\n# a comment\n')
    assert m.samples[0].labels == {"a": 'say "hi"', "b": "c,d"} and m.samples[0].value == float("inf")
    assert m.get("y") != m.get("y")   # NaN
    with pytest.raises(ParseError, match="not Prometheus text"):
        parse_metrics("<html>404 page not found</html>")


# ---------------------------------------------------------------- start-up logs
def test_sglang_startup_log():
    """SGLang's log: the default backend it chose, ServerArgs, CUDA graph batch sizes, KV cache tokens."""
    f = parse_startup_log(text("sglang_startup.log"))
    assert f.engine == "sglang" and f.attention_backend == "fa3" and f.attention_backend_default is True
    assert f.server_args["tp_size"] == 2 and f.server_args["cuda_graph_bs"] is None
    assert f.cuda_graph_bs is not None and f.cuda_graph_bs[:4] == [1, 2, 4, 8] and f.cuda_graph_bs[-1] == 256
    assert f.kv_cache_tokens == 1424880 and f.kv_cache_dtype == "torch.bfloat16" and f.cuda_graph_seconds == 5.61
    assert (f.architecture, f.dtype) == ("Qwen3ForCausalLM", "torch.bfloat16") and f.notes == []


def test_explicit_backend_is_not_a_default():
    """Without the "not specified" line, a backend from ServerArgs was given, not chosen."""
    f = parse_startup_log("[t] server_args=ServerArgs(model_path='m', attention_backend='flashinfer', tp_size=1)\n")
    assert f.attention_backend == "flashinfer" and f.attention_backend_default is False
    g = parse_startup_log("[t] Attention backend not explicitly specified. Use flashinfer backend by default.\n")
    assert g.attention_backend == "flashinfer" and g.attention_backend_default is True


def test_vllm_startup_log():
    """vLLM's log: version, non-default args (a nested config object too), the engine config, the backend
    chosen from its candidates, the FlashAttention version, KV cache tokens, graph capture time."""
    f = parse_startup_log(text("vllm_startup.log"))
    assert f.engine == "vllm" and f.version == "0.11.0"
    assert f.non_default_args["max_model_len"] == 16384 and f.non_default_args["kv_transfer_config"]["kv_port"] == 14579
    assert f.engine_config["dtype"] == "torch.bfloat16" and f.engine_config["enforce_eager"] is False
    assert f.attention_backend == "FLASH_ATTN" and f.attention_backend_candidates[:2] == ["FLASH_ATTN", "FLASHINFER"]
    assert f.flash_attn_version == 3 and f.kv_cache_tokens == 725408 and f.cuda_graph_seconds == 6.0
    assert f.max_concurrency == 44.28


def test_older_vllm_backend_line():
    """The older `Using Flash Attention backend on V1 engine.` line names the backend too."""
    f = parse_startup_log("INFO 03-12 14:57:38 [cuda.py:215] Using Flash Attention backend on V1 engine.\n")
    assert f.attention_backend == "Flash Attention"


def test_ranks_that_disagree_are_noted():
    """Every TP rank repeats its lines; the first value is kept and a rank that disagrees is noted."""
    f = parse_startup_log("[t TP0] KV Cache is allocated. #tokens: 100, K size: 1 GB\n"
                          "[t TP1] KV Cache is allocated. #tokens: 90, K size: 1 GB\n")
    assert f.kv_cache_tokens == 100 and len(f.notes) == 1 and "90" in f.notes[0]


# ---------------------------------------------------------------- check_env / collect-env
def test_sglang_check_env_versions():
    """check_env's versions by canonical name; `Module Not Found` is missing, not a version; topology left out."""
    r = parse_check_env(text("sglang_check_env.txt"))
    assert {k: r.versions[k] for k in ("sglang", "sgl_kernel", "flashinfer", "triton", "torch", "cuda", "driver")} == {
        "sglang": "0.5.6", "sgl_kernel": "0.3.17.post1", "flashinfer": "0.5.3", "triton": "3.4.0",
        "torch": "2.8.0+cu129", "cuda": "12.9.86", "driver": "580.159.04"}
    assert "vllm" not in r.versions and "vllm" in r.missing and r.gpus == ["NVIDIA H200"]
    assert r.fields["Hypervisor vendor"] == "KVM" and "GPU0" not in r.fields and "Legend" not in r.fields


def test_vllm_collect_env_sectioned_layout():
    """The newer sectioned collect-env: versions from fields and `[pip3]` lines; the environment variables block."""
    r = parse_collect_env(text("vllm_collect_env.txt"))
    assert r.versions["vllm"] == "0.11.0" and r.versions["torch"] == "2.8.0+cu128" and r.versions["flashinfer"] == "0.3.1"
    assert r.versions["driver"] == "580.159.04" and r.versions["cuda"] == "12.8.93" and r.versions["triton"] == "3.4.0"
    assert r.env["VLLM_USAGE_SOURCE"] == "production-docker-image" and r.env["CUDA_MODULE_LOADING"] == "LAZY"
    assert r.gpus == ["NVIDIA H200"] and "Architecture" not in r.fields and r.packages["nvidia-nccl-cu12"] == "2.27.3"


def test_torch_collect_env_from_the_h200():
    """The real H200 `python -m torch.utils.collect_env` (the layout older vllm collect_env.py extends)."""
    r = parse_collect_env(text("torch_collect_env_h200.txt"))
    assert r.versions["torch"] == "2.11.0+cu130" and r.versions["driver"] == "580.159.04"
    assert r.versions["cuda"] == "13.0.88" and r.versions["triton"] == "3.6.0" and r.versions["nccl"] == "2.28.9"
    assert r.gpus == ["NVIDIA H200"] and "Model name" not in r.fields and "Vulnerability Srbds" not in r.fields


def test_env_reports_need_some_shape():
    """Text with no `Key: value` line is a ParseError."""
    with pytest.raises(ParseError):
        parse_check_env("\n\n")
    with pytest.raises(ParseError):
        parse_collect_env("just words\n")


# ---------------------------------------------------------------- the effective configuration and its diff
def test_effective_config_prefers_what_the_server_runs():
    """The scheduler's resolved backends win over the arguments; `auto` gives way to the dtype the log saw."""
    si = parse_sglang_server_info(text("sglang_get_server_info.json"))
    log = parse_startup_log(text("sglang_startup.log"))
    cfg = effective_config(server_info=si, log=log, env=parse_check_env(text("sglang_check_env.txt")))
    assert cfg.decode_attention_backend == "fa3" and cfg.sources["decode_attention_backend"] == "server_info.internal_states"
    assert cfg.dtype == "bfloat16" and cfg.kv_cache_dtype == "bfloat16" and cfg.sources["dtype"] == "startup log"
    assert cfg.kv_cache_tokens == 712440 and cfg.versions["flashinfer"] == "0.5.3" and cfg.last_gen_throughput == 1187.4213


def test_vllm_effective_config_from_log_metrics_and_env():
    """vLLM's effective config: backend from the log, capture sizes from the compilation config, versions."""
    cfg = effective_config(log=parse_startup_log(text("vllm_startup.log")), metrics=parse_metrics(text("vllm_metrics.txt")),
                           env=parse_collect_env(text("vllm_collect_env.txt")), version="0.11.0")
    assert (cfg.engine, cfg.version, cfg.attention_backend, cfg.flash_attn_version, cfg.dtype) == \
        ("vllm", "0.11.0", "FLASH_ATTN", 3, "bfloat16")
    assert cfg.cuda_graph_bs is not None and cfg.cuda_graph_bs[0] == 1 and cfg.cuda_graph_bs[-1] == 512
    assert cfg.kv_cache_tokens == 725408 and cfg.env["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


def test_a_changed_default_shows_in_the_diff():
    """Same flags, another flashinfer and another backend chosen: the diff names both; measurements are not diffed."""
    before = parse_startup_log("[t] Attention backend not specified. Use flashinfer backend by default.\n"
                               "[t] server_args=ServerArgs(model_path='m', attention_backend='flashinfer', tp_size=1)\n")
    after = parse_startup_log(text("sglang_startup.log"))
    env_a = parse_check_env(text("sglang_check_env.txt").replace("flashinfer_python: 0.5.3", "flashinfer_python: 0.4.1"))
    a = effective_config(log=before, env=env_a)
    b = effective_config(log=after, env=parse_check_env(text("sglang_check_env.txt")))
    b.last_gen_throughput = 900.0
    changes = {c.path: (c.before, c.after) for c in diff_configs(a, b)}
    assert changes["attention_backend"] == ("flashinfer", "fa3") and changes["versions.flashinfer"] == ("0.4.1", "0.5.3")
    assert changes["tp_size"] == (1, 2) and "last_gen_throughput" not in changes and "cuda_graph_bs" not in changes
    assert diff_configs(b, b) == [] and diff_configs(EffectiveConfig(), b) == []


# ---------------------------------------------------------------- properties
PARSERS = [parse_repr, parse_kwargs, parse_sglang_server_info, parse_sglang_model_info, parse_vllm_version, parse_metrics,
           parse_startup_log, parse_check_env, parse_collect_env]
FRAGMENTS = ["server_args=ServerArgs(", "non-default args: {", "Initializing a V1 LLM engine (v0.1) with config: ",
             "Capture cuda graph bs [", "KV Cache is allocated. #tokens: ", "GPU KV cache size: ", "{", "[", "(", "'", '"',
             "=", ",", ")", "]", "}", "\n", "x", "1", "None", "vllm:cache_config_info{a=\"", "} 1", "sglang: ", "[pip3] a==",
             "Using X attention backend out of potential backends: [", "<obj at 0x1>", "\\"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=300), st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)))
def test_parsers_never_crash_on_arbitrary_text(blob):
    """Every parser returns a result or raises ParseError, on any text."""
    for fn in PARSERS:
        try:
            fn(blob)
        except ParseError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=6)),
                    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)),
                    max_leaves=20))
def test_server_info_of_any_json_shape(obj):
    """Any JSON value as a /server_info answer gives a result or a ParseError, and merges into a config."""
    try:
        si = parse_sglang_server_info(json.dumps(obj))
    except ParseError:
        return
    effective_config(server_info=si)


def test_deep_nesting_is_a_parse_error_not_a_recursion_error():
    """Pathologically nested reprs stop with a ParseError."""
    with pytest.raises(ParseError):
        parse_repr("[" * 5000)
