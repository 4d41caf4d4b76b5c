"""The CPU torch engine program: a separate OS process that speaks SGLang's HTTP API.

A process of its own so that killing it is a real process death, as with an SGLang server; the
engine slots in :mod:`engines` drive it exactly as they drive SGLang. Run it with
``python -m engines.cpu`` (or ``lifecycle-torch-engine``); it decodes with :mod:`engines.models`.
"""
