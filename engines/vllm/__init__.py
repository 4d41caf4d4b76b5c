"""Our side of a real vLLM server: weight-transfer engines that vLLM loads as a plugin.

vLLM's weight-update session (``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``)
hands each chunk to a *weight-transfer engine* inside the worker process; its built-in ones (nccl, ipc,
...) need GPUs. :mod:`engines.vllm.plugin` adds ours -- ``lifecycle_disk`` (a checkpoint directory),
``lifecycle_gloo`` (the trainer's gloo broadcast) and ``lifecycle`` (either) -- through the
``vllm.general_plugins`` entry point. That module imports vllm and runs only in vLLM's own environment;
this package file imports nothing, so the main environment (no vllm) can still import ``engines``.
"""
