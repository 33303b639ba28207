"""Runtime shims for upstream libraries (megatron-core, vLLM, torch DCP), installed as
`verl_mp.patches` (setup.py's ``package_dir``). Each module names the upstream version and the
behaviour it works around, and when it can go; the code that needs a shim applies it.
"""
