"""Call 3 of 2026-12-06 (H100): a bare sglang.Engine outside torchrun, the tiny Qwen2 of
tests/gpu/test_rollout_sglang_gpu.py, SGLang's info log: start-up, one generate with
log-probs, release/resume of its memory. Run with the kit's PYTHONPATH (gpu_session.sh's
setup_sglang). Output: 2_bare_engine.log."""
import faulthandler
import time

import torch


def main():
    faulthandler.dump_traceback_later(100, exit=False)
    from verl_mp.demo.tiny_models import save_tiny_qwen2
    m = save_tiny_qwen2("/tmp/dm", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, dtype=torch.bfloat16)
    import sglang
    t = time.time()
    e = sglang.Engine(model_path=str(m), dtype="bfloat16", context_length=128, mem_fraction_static=0.3, load_format="auto",
                      enable_memory_saver=True, skip_tokenizer_init=True, random_seed=0, log_level="info",
                      attention_backend="triton")
    print("engine up", time.time() - t, flush=True)
    o = e.generate(input_ids=[[5, 6, 7, 8]], sampling_params={"max_new_tokens": 8, "temperature": 1.0}, return_logprob=True)
    print("gen", o[0]["output_ids"], flush=True)
    e.release_memory_occupation()
    e.resume_memory_occupation()
    print("sleepwake ok", flush=True)
    e.shutdown()


if __name__ == "__main__":
    main()
