"""Cascade's offline half: data, features, dataloader, training, evaluation, export."""
