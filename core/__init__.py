"""What the offline and online sides share, and nothing else: errors and exit codes, the
fitted feature transform (``features``), the export layout and its verification (``export``),
the item-neighbour table and the tree ranker as serving reads them. Imports nothing of ours."""
