"""A Llama-architecture signal stage for the strategy (docs/inference.md).

Import the parts from their modules: ``features`` (what the model reads), ``runtime``
(llama.cpp, transformers, OpenAI-compatible HTTP), ``stage`` (the worker process and the
staleness-bounded ``SignalHook``). Nothing heavy is imported until a model is loaded.
"""
