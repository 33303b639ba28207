"""Memory planner: per-GPU memory of every phase of a run, from config.json and the run
config, before anything starts (no GPU, no process group needed).

- `plan_memory(cfg, spec, MemoryPlanOptions(gpu_memory_gib=...)) -> MemoryPlan`: per-phase bytes by holder,
  the peak phase, whether it fits (`verl_mp.planner.memory_plan`; formulas in
  `verl_mp.planner.memory` and `verl_mp.planner.rollout`).
- `suggest(cfg, spec, options) -> [Suggestion]`: ranked, re-planned overrides that lower
  the peak (`verl_mp.planner.advice`).
- `check_fits(cfg, spec, gpu_memory_gib)`: raises ValueError with the numbers and the
  fixes when the run cannot fit; `check_run_fits` and `choose_for_run` are the trainer's
  preflight on the run's GPU (`run_gpu_memory_gib`).
- ``verl-mp plan --config-name X [overrides] [--gpu-memory-gib 80]`` prints the table
  (`verl_mp.planner.cli`).
"""

from verl_mp.planner.advice import Suggestion, suggest
from verl_mp.planner.check import check_fits, check_run_fits, choose_for_run, run_gpu_memory_gib
from verl_mp.planner.memory_plan import MemoryPlan, MemoryPlanOptions, plan_memory

__all__ = ["MemoryPlan", "MemoryPlanOptions", "Suggestion", "check_fits", "check_run_fits", "choose_for_run", "plan_memory",
           "run_gpu_memory_gib", "suggest"]
