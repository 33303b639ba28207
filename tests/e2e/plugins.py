"""Plugins that the end-to-end runs load by ``module:function`` path, as a user's would be."""

from verl_mp.algo import advantage_estimator, gae

CALLS_ENV = "VERL_MP_TEST_PLUGIN_CALLS"


@advantage_estimator(inputs=("values",), params={"gamma": "gamma", "lam": "lam"})
def values_baseline(token_level_rewards, response_mask, values, gamma, lam, scale=1.0):
    """GAE, scaled by ``algorithm.estimator_kwargs.scale``: a plugin that needs a critic."""
    if values is None or values.shape != token_level_rewards.shape:
        raise AssertionError("the plugin did not receive the critic's values")
    adv, ret = gae(token_level_rewards, values, response_mask, gamma, lam)
    return adv * scale, ret
