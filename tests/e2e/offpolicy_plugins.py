"""A reward the random tiny model earns sometimes, so that its updates are not zero and
some of its groups have equal rewards (dynamic sampling has something to drop)."""


def has_digit(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response contains a digit, else 0."""
    return float(any(c.isdigit() for c in solution_str))
