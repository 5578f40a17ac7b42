"""The validation gate: a candidate version against production on the same recent holdout."""
