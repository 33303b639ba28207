"""``rollout.backend=sglang`` on a machine that cannot run SGLang (this one: no CUDA, no sglang
installed): the trainer's CLI refuses it before anything starts, with the setting, the reason
and the fix; the engine refuses it too where it would start. Plus the backend's own pure parts
(requests, seeds, engine arguments, weight batches, the update's answer, the rank's logging
across the engine's start); what SGLang does with them is tests/gpu/test_rollout_sglang_gpu.py's
(nothing of SGLang is imitated here but its engine's ``shutdown`` raising, for `close`)."""

import logging

import pytest
import torch

from verl_mp.cli import main as cli_main
from verl_mp.config.rollout import RolloutConfig, SamplingConfig, validate_sync_mode
from verl_mp.rollout.sglang_compat import check_rollout_backend, sglang_blocker, sglang_version
from verl_mp.rollout.sglang_rollout import (SGLangRollout, check_update, engine_kwargs, engine_start_env,
                                            request_batch, weight_batches)

pytestmark = pytest.mark.unit

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@no_cuda
def test_the_cli_refuses_sglang_without_cuda_before_anything_starts(inputs, nothing_starts, capsys, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc = cli_main(["train", "--config-name", "grpo", *inputs, "rollout.backend=sglang"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert "rollout.backend=sglang needs CUDA GPUs" in err and "use rollout.backend=vllm" in err, err


@no_cuda
def test_the_engine_refuses_sglang_without_cuda(tmp_path):
    from verl_mp.rollout import build_rollout

    with pytest.raises(RuntimeError, match="rollout.backend=sglang needs CUDA GPUs"):
        build_rollout(RolloutConfig(backend="sglang"), str(tmp_path), num_kv_heads=2)


@pytest.mark.skipif(sglang_version() is not None, reason="sglang is installed here")
def test_without_sglang_the_message_names_the_install_extra(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    reason = sglang_blocker(cuda=True)
    assert reason.startswith("rollout.backend=sglang needs SGLang, which is not installed")
    assert "verl_mp[sglang]" in reason and "sglang==0.5.17" in reason and "sglang-kernel==0.4.5" in reason
    with pytest.raises(ValueError, match=r"verl_mp\[sglang\]"):
        check_rollout_backend("sglang", cuda_ranks=True)


def test_the_pinned_install_passes_and_each_mismatch_is_named(monkeypatch):
    """The checks read distribution metadata only (nothing of SGLang is imported): the pinned set
    passes; another transformers (the GPU image's 5.17, under which sglang 0.5.17's engine does not
    import), another kernel release, or the clashing sgl-kernel beside it are each refused by name."""
    from verl_mp.rollout import sglang_compat

    installed = {"sglang": "0.5.17", "sglang-kernel": "0.4.5", "transformers": "5.12.1"}
    monkeypatch.setattr(sglang_compat, "_module_present", lambda name: name in ("sglang", "sgl_kernel"))
    monkeypatch.setattr(sglang_compat, "_dist_version", lambda name: installed.get(name))
    assert sglang_blocker(cuda=True) is None
    installed["transformers"] = "5.17.0"
    assert "needs transformers==5.12.1" in sglang_blocker(cuda=True) and "qwen3_asr" in sglang_blocker(cuda=True)
    installed.update({"transformers": "5.12.1", "sglang-kernel": "0.4.10"})
    assert "needs sglang-kernel==0.4.5" in sglang_blocker(cuda=True)
    installed.update({"sglang-kernel": "0.4.5", "sgl-kernel": "0.3.21"})
    assert "pip uninstall sgl-kernel" in sglang_blocker(cuda=True)
    installed.update({"sgl-kernel": None, "sglang": "0.5.23"})
    assert "built against sglang 0.5.17, this machine has 0.5.23" in sglang_blocker(cuda=True)


def test_a_ray_driver_leaves_the_check_to_the_workers():
    check_rollout_backend("sglang", cuda_ranks=None)  # ranks elsewhere: SGLangRollout checks where it starts
    check_rollout_backend("vllm", cuda_ranks=False)


def test_the_local_sync_is_refused_for_sglang():
    with pytest.raises(ValueError, match="the sglang backend loads full HF tensors"):
        validate_sync_mode("local", 1, 1, "sglang", cuda=True)


def test_each_sample_is_one_request_with_its_own_seed():
    sampling = SamplingConfig(n=2, temperature=0.7, top_k=-1, max_new_tokens=5, seed=100, stop_token_ids=[9])
    ids, params = request_batch([[1, 2], [3], [4, 5, 6]], [0, 2], sampling)
    assert ids == [[1, 2], [1, 2], [4, 5, 6], [4, 5, 6]]
    assert [p["sampling_seed"] for p in params] == [100, 101, 104, 105]  # seed + prompt * n + sample
    assert params[0] == dict(temperature=0.7, top_p=1.0, top_k=-1, max_new_tokens=5, stop_token_ids=[9],
                             ignore_eos=False, no_stop_trim=True, sampling_seed=100)
    _, unseeded = request_batch([[1]], [0], SamplingConfig(top_k=0))
    assert "sampling_seed" not in unseeded[0] and unseeded[0]["top_k"] == -1


def test_engine_arguments_follow_the_rollout_config():
    cfg = RolloutConfig(backend="sglang", tensor_model_parallel_size=2, dtype="bf16", max_model_len=512,
                        gpu_memory_utilization=0.3, sleep_level=1, sglang_attention_backend="triton")
    kw = engine_kwargs(cfg, "/m", 4)
    assert (kw["tp_size"], kw["base_gpu_id"], kw["dtype"], kw["mem_fraction_static"]) == (2, 4, "bfloat16", 0.3)
    # SGLang generates up to context_length - 2 tokens: 2 more than max_model_len, so that the prompt and
    # max_new_tokens fit where they fit vLLM; never past the model's positions (SGLang refuses that)
    assert kw["context_length"] == 514 and engine_kwargs(cfg, "/m", 4, max_positions=4096)["context_length"] == 514
    assert engine_kwargs(cfg, "/m", 4, max_positions=513)["context_length"] == 513
    assert engine_kwargs(cfg, "/m", 4, max_positions=512)["context_length"] == 512
    assert kw["enable_memory_saver"] and kw["enable_weights_cpu_backup"] and kw["attention_backend"] == "triton"
    assert kw["skip_tokenizer_init"] and "enable_deterministic_inference" not in kw
    level2 = engine_kwargs(RolloutConfig(backend="sglang", sglang_deterministic=True), "/m", 0)
    assert not level2["enable_weights_cpu_backup"] and "attention_backend" not in level2
    assert level2["enable_deterministic_inference"] and level2["sampling_backend"] == "pytorch"
    # the planner's CUDA-graph range is SGLang's largest decode graph (a field of SGLang 0.5.17's ServerArgs)
    assert "cuda_graph_max_bs_decode" not in kw and "cuda_graph_max_bs_decode" not in level2
    assert engine_kwargs(RolloutConfig(backend="sglang", cudagraph_max_tokens=512), "/m", 0)["cuda_graph_max_bs_decode"] == 512
    eager = engine_kwargs(RolloutConfig(backend="sglang", cudagraph_max_tokens=512, enforce_eager=True), "/m", 0)
    assert eager["disable_cuda_graph"] and "cuda_graph_max_bs_decode" not in eager


def test_weight_batches_reach_the_bucket_and_never_split_a_tensor():
    tensors = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([3, 3, 10, 1, 1, 1])]  # fp32: 4 bytes each
    batches = list(weight_batches(iter(tensors), bucket_bytes=24))
    assert [[n for n, _ in b] for b in batches] == [["w0", "w1"], ["w2"], ["w3", "w4", "w5"]]
    assert list(weight_batches(iter([]), 24)) == []


def test_the_engine_start_leaves_the_ranks_logging_as_it_was():
    """sglang 0.5.17's engine start runs ``logging.basicConfig(level=ERROR, force=True)`` in the
    calling process (its ``configure_logger``); what the rank had is back after the start."""
    root = logging.getLogger()
    before_handlers, before_level = root.handlers[:], root.level
    seen: list[str] = []
    mine = logging.Handler()
    mine.emit = lambda record: seen.append(record.getMessage())
    root.addHandler(mine)
    root.setLevel(logging.INFO)
    try:
        with engine_start_env():
            logging.basicConfig(level=logging.ERROR, force=True, format="%(message)s")  # what SGLang does
            assert mine not in root.handlers and root.level == logging.ERROR
        logging.getLogger("verl_mp.trainer").info("step 1 done")
        assert mine in root.handlers and root.level == logging.INFO and seen == ["step 1 done"]
        assert len(root.handlers) == len(before_handlers) + 1  # SGLang's own handler is gone
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in before_handlers:
            root.addHandler(h)
        root.setLevel(before_level)


def test_a_refused_weight_update_stops_with_sglangs_message():
    batch = [("model.embed_tokens.weight", torch.zeros(2)), ("lm_head.weight", torch.zeros(2))]
    check_update((True, "Succeeded to update model weights."), batch)
    with pytest.raises(RuntimeError, match="refused the weight update of 2 tensors .*embed_tokens.*lm_head.*shape "
                                           "mismatch.*previous policy"):
        check_update((False, "shape mismatch for lm_head.weight"), batch)


def test_a_failing_engine_shutdown_is_logged_not_raised(caplog):
    class Engine:  # the one call close() makes; SGLang's engine itself needs CUDA (see the module docstring)
        def shutdown(self):
            raise RuntimeError("child 123 not reaped within 60 s")

    rollout = SGLangRollout.__new__(SGLangRollout)
    rollout.engine = Engine()
    with caplog.at_level(logging.ERROR):
        rollout.close()
    assert rollout.engine is None and "child 123 not reaped" in caplog.text
