"""``cascade retrain``: logged outcomes -> training data -> models -> gate -> registry."""
