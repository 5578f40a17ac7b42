"""Export: versioned ONNX models, FAISS index, embedding tables, tree model, workflow, manifest."""
