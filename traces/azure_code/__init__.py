"""The Azure LLM inference trace 2023 (code), as published (CC-BY-4.0, Microsoft)."""

from pathlib import Path

CSV_PATH = Path(__file__).with_name("AzureLLMInferenceTrace_code.csv")
