"""Rank program for tests/dist/test_docs_extending.py: run the registration block of
docs/extending.md (``--snippet``), then `verl_mp.cli.rank_verify` (engine log-probs vs HF)."""

import sys
from pathlib import Path

if __name__ == "__main__":
    snippet = Path(sys.argv[sys.argv.index("--snippet") + 1])
    exec(compile(snippet.read_text(), "docs/extending.md:register_seed_oss", "exec"), {})
    from verl_mp.cli import rank_verify as verify

    rest = [a for i, a in enumerate(sys.argv[1:], 1)
            if a != "--snippet" and sys.argv[i - 1] != "--snippet"]
    verify.main(rest)
