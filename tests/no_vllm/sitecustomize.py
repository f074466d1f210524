"""Put this folder on PYTHONPATH and ``import vllm`` fails, as where the extra is not installed."""

import sys

sys.modules["vllm"] = None  # find_spec("vllm") is None and ``import vllm`` raises ImportError
