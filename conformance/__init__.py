"""Differential conformance of the model families (issue 28, items 4-5).

Our own renderer and parser are never the only judge: a corpus of agent conversations (``corpus.py``) is
written in each family's output format (``formats.py``), sent through the gateway (by
``tokentrail/commands/conformance_drive.py``), and what the gateway
recorded is checked against implementations we did not write: ``renderers`` / ``openai-harmony`` for the
prompt ids (``judge.py``), vLLM's own tool and reasoning parsers for the parsed outputs (``vllm_parsers.py``,
run in vLLM's virtual environment by ``vllm_worker.py``).
"""
