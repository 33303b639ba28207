"""The presets that run an embedded demo when no model or data is given, and their settings."""

from __future__ import annotations

from verl_mp.demo.tool_demo import TOOL_DEMO
from verl_mp.demo.warm_start import DEMO_PRESETS as _WARM_START_PRESETS
from verl_mp.demo.warm_start import DemoSettings

DEMO_PRESETS: dict[str, DemoSettings] = {**_WARM_START_PRESETS, "tiny_tool_cpu": TOOL_DEMO}
"""``tiny_cpu``, ``tiny_moe_cpu``, ``demo_gpu`` (`verl_mp.demo.warm_start`) and ``tiny_tool_cpu``
(the multi-turn tool demo, `verl_mp.demo.tool_demo`)."""
