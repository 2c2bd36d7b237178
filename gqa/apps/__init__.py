"""gqa's application wing: the commands of ``python -m gqa`` (bench, demo, eval), the model
readers and forwards they run (gguf, llama, gemma), the peers they compare with (ort_peer,
model_peers), their texts and terminal helpers.

The rule of the layers: modules here use the library's public names (``import gqa``) only;
nothing in the library imports this package (tests/test_layers.py checks both).
"""
