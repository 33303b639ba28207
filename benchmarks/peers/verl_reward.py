"""verl's custom reward function for the peer benchmark (``reward.custom_reward_function``): the
same rule verl_mp and the TRL script score with (`verl_mp.reward.rules.arith_exact_reward`,
whose signature is verl's ``compute_score``)."""

from verl_mp.reward.rules import arith_exact_reward


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    return arith_exact_reward(data_source, solution_str, ground_truth, extra_info)["score"]
