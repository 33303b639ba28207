"""`verl-mp train`: the same as `python -m verl_mp.trainer.main`."""

from verl_mp.trainer.main import add_arguments, train


def add_subcommands(sub) -> None:
    p = sub.add_parser("train", help="run RL training (default: the embedded tiny CPU demo)")
    add_arguments(p)
    p.set_defaults(func=train)
