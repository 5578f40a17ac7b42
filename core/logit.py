"""The log-odds of a probability, as the ranker blends its models' scores (on the logit
scale): for a tree model served as probabilities (FIL on the GPU image)."""

from __future__ import annotations

import numpy as np

# The smallest distance from 0 and 1 a probability keeps before its logit is taken: float32
# holds 1 - 1e-7 (its spacing below 1 is 6e-8), so a logit is at most about 16.1 in size.
PROBABILITY_FLOOR = 1e-7


def probability_logits(probability: np.ndarray) -> np.ndarray:
    """The log-odds of the trees' probabilities (what FIL answers for a binary model: the
    model's sigmoid applied), as float32, for the blend on the logit scale."""
    p = np.clip(np.asarray(probability, dtype=np.float64), PROBABILITY_FLOOR, 1 - PROBABILITY_FLOOR)
    return (np.log(p) - np.log1p(-p)).astype(np.float32)
