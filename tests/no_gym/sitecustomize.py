"""Put this folder on PYTHONPATH and ``import reasoning_gym`` fails, as where the gym extra is not installed."""

import sys

sys.modules["reasoning_gym"] = None  # ``import reasoning_gym`` raises ImportError
