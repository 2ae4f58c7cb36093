"""SLO load-test sweeps for Gemma 4 image/video serving on vLLM, driven by guidellm."""

__version__ = "0.1.0"
