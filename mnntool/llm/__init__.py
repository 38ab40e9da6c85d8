"""Language models: export to MNN-LLM's bundle."""
