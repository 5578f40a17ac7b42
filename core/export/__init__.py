"""The export contract: version layout, manifests and their verification, the ANN index
file and the drift reference format."""
